"""OpenAI's /v1/completions wire format: the request (the shared sampling fields plus the
prompt, echo and logprobs) and the response and stream chunk built from it."""

from __future__ import annotations

import time
from typing import Any, Literal, Mapping

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr, model_validator

from tacit.entrypoints.openai.protocol import PromptLogprobs, SamplingRequest, UsageInfo
from tacit.sampling_params import SamplingParams


class CompletionRequest(SamplingRequest):
    # One prompt or a batch: text, token ids, or lists of either. Order matters for pydantic's
    # union: list[int] before list[str] so [1, 2] stays token ids.
    prompt: StrictStr | list[StrictInt] | list[list[StrictInt]] | list[StrictStr]
    max_tokens: StrictInt | None = 16  # OpenAI's default for /v1/completions
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "CompletionRequest":
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be an empty list")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    @property
    def echoes_logprobs(self) -> bool:
        """echo with logprobs: the logprobs object covers the prompt's tokens before the generated ones."""
        return self.echo and self.logprobs is not None

    def to_sampling_params(self, defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """defaults: the model's sampling values, for the fields left unset (SamplingRequest)."""
        prompt_logprobs = self.prompt_logprobs
        if self.echoes_logprobs:  # as vLLM: the echoed prompt is scored like the generated tokens
            prompt_logprobs = max(prompt_logprobs or 0, self.logprobs)
        return self._sampling_params(self.max_tokens, self.logprobs, prompt_logprobs, defaults)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponseChoice(CompletionChoice):
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
