"""OpenAI's /v1/chat/completions wire format: messages, tools and tool_choice on the request
(with the shared sampling fields), and the response, its tool calls and logprobs, and the
stream chunks built from it."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from tacit.entrypoints.openai.protocol import OpenAIModel, PromptLogprobs, SamplingRequest, UsageInfo
from tacit.sampling_params import SamplingParams


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(OpenAIModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ...: passed through to the template
    role: StrictStr
    content: StrictStr | list[TextPart] | None = None

    def to_template_dict(self) -> dict[str, Any]:
        d = self.model_dump(exclude_none=True)
        content = self.content
        if isinstance(content, list):  # text parts are joined: templates expect a string
            d["content"] = "".join(part.text for part in content)
        elif content is None:
            d["content"] = ""
        if d["role"] == "assistant" and isinstance(d.get("reasoning_content"), str) and "thinking" not in d:
            # A reply's reasoning_content sent back in the history: gpt-oss's template renders an
            # earlier call's analysis from `thinking` (Qwen3's reads reasoning_content itself).
            d["thinking"] = d["reasoning_content"]
        return d


class FunctionDefinition(OpenAIModel):
    name: StrictStr = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema for the arguments
    strict: StrictBool | None = None


class ChatTool(OpenAIModel):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(OpenAIModel):
    name: StrictStr


class NamedToolChoice(OpenAIModel):
    type: Literal["function"]
    function: ToolChoiceFunction


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    # None means OpenAI's default: "auto" when tools are given, "none" otherwise.
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    max_completion_tokens: StrictInt | None = None  # the newer name for max_tokens; wins if both
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool = True
    # OpenAI's values; passed to the chat template, which gpt-oss's reads ("Reasoning: high").
    # Any other value is a 400 naming the field (pydantic), and so is any value on a model whose
    # template does not read it (serving_chat.py), never silently ignored.
    reasoning_effort: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="after")
    def _check(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    @property
    def tool_mode(self) -> str:
        """ "none", "auto", "required" or "named"."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or ("auto" if self.tools else "none")

    def tool_definitions(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template sees them; None when no call may be made."""
        if not self.tools or self.tool_mode == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def to_sampling_params(self, defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """defaults: the model's sampling values, for the fields left unset (SamplingRequest)."""
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._sampling_params(max_tokens, (self.top_logprobs or 0) if self.logprobs else None, None, defaults)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str = Field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(ToolCallOut):
    index: int


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    # vLLM's field for a reasoning model's thinking (gpt-oss's analysis channel), beside content.
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo | None = None
    prompt_logprobs: PromptLogprobs | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
