"""vLLM's /tokenize and /detokenize wire format: a prompt or chat messages (rendered as chat
would render them) to token ids, and token ids back to text."""

from __future__ import annotations

from pydantic import BaseModel, StrictBool, StrictInt, StrictStr, model_validator

from tacit.entrypoints.openai.chat_protocol import ChatMessage, ChatTool
from tacit.entrypoints.openai.protocol import OpenAIModel


class TokenizeRequest(OpenAIModel):
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ChatTool] | None = None  # rendered with messages, as chat would render them
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if self.tools is not None and self.messages is None:
            raise ValueError("tools go with messages, not with prompt")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(OpenAIModel):
    model: StrictStr | None = None
    tokens: list[StrictInt]


class DetokenizeResponse(BaseModel):
    prompt: str
