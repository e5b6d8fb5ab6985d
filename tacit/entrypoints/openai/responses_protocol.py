"""OpenAI's Responses API wire format (POST /v1/responses): the request, validated, and the
response object and stream events built from it.

What is served is what the Chat Completions path can: text (or text parts) in, one assistant
message of text out, sampled with temperature/top_p, streamed as the typed events OpenAI sends.
A field that needs more (tools, stored responses, reasoning) is refused by name, never ignored.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Mapping

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from tacit.entrypoints.openai.protocol import OpenAIModel, sampling_fields
from tacit.sampling_params import SamplingParams, StructuredOutputsParams


class InputTextPart(OpenAIModel):
    # output_text parts appear when a client replays an earlier answer as an assistant turn.
    type: Literal["input_text", "output_text"]
    text: StrictStr
    annotations: list[Any] | None = None  # output_text parts carry them; empty for plain text


class InputMessage(OpenAIModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[InputTextPart]
    # An earlier response's output item, replayed as input, carries these two.
    id: StrictStr | None = None
    status: StrictStr | None = None

    def to_template_dict(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        # "developer" is the Responses API's name for the system turn; chat templates know "system".
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class TextFormat(OpenAIModel):
    # The Responses API spells Chat's response_format flat: {"type": "json_schema", "name",
    # "schema", "strict", "description"}.
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None

    def structured_outputs(self) -> StructuredOutputsParams | None:
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.type == "json_schema":
            if self.schema_ is None:
                raise ValueError('text.format type "json_schema" needs text.format.schema')
            return StructuredOutputsParams(json=self.schema_)
        return None


class TextConfig(OpenAIModel):
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(OpenAIModel):
    model: StrictStr | None = None
    input: StrictStr | list[InputMessage]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    stream: StrictBool = False
    # Stored responses (GET /v1/responses/{id}, previous_response_id) are not kept by this
    # server: store=true is refused rather than answered as if it had been stored.
    store: StrictBool | None = None
    text: TextConfig | None = None
    user: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None
    # vLLM's extension, as on completions and chat: prefix-cache blocks are shared only within a salt.
    cache_salt: StrictStr | None = None

    @field_validator("store")
    @classmethod
    def _not_stored(cls, store: bool | None) -> bool | None:
        if store:
            raise ValueError("store=true is not supported: this server does not keep responses; omit it or send false")
        return store

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[InputMessage]) -> str | list[InputMessage]:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        return value

    def messages(self) -> list[dict[str, str]]:
        turns = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else []
        if isinstance(self.input, list):
            turns = [m.to_template_dict() for m in self.input]
        if self.instructions is not None:
            turns.insert(0, {"role": "system", "content": self.instructions})
        return turns

    def to_sampling_params(self, defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """Raises ValueError naming the field when a value is out of range. Unset temperature and
        top_p are the model's defaults, else OpenAI's (1, 1); top_k, min_p and repetition_penalty,
        which the Responses API has no field for, the model's where it sets them."""
        kw: dict[str, Any] = {"max_tokens": self.max_output_tokens}
        if self.text is not None:
            kw["structured_outputs"] = self.text.format.structured_outputs()
        kw.update(sampling_fields(self, ("temperature", "top_p"), defaults))
        kw.update({k: v for k, v in (defaults or {}).items() if k in ("top_k", "min_p", "repetition_penalty")})
        return SamplingParams(**kw)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputMessage] = Field(default_factory=list)
    parallel_tool_calls: bool = False
    previous_response_id: None = None
    store: bool = False
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})  # echoed from the request
    tool_choice: str = "none"
    tools: list[Any] = Field(default_factory=list)
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
