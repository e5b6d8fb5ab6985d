"""OpenAI's /v1/embeddings wire format: one input or a batch (text, or token ids), the vectors as
float lists or as base64 (little-endian float32 bytes: what the official client asks for by
default and decodes with numpy.frombuffer)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, StrictInt, StrictStr, field_validator

from tacit.entrypoints.openai.protocol import OpenAIModel, UsageInfo

EmbeddingInput = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class EmbeddingRequest(OpenAIModel):
    input: EmbeddingInput
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    # Matryoshka truncation (OpenAI's field): the first N values, normalised again.
    dimensions: StrictInt | None = None
    # OpenAI's end-user identifier, for abuse monitoring: it changes no result (vLLM takes it too).
    user: StrictStr | None = None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, v: EmbeddingInput) -> EmbeddingInput:
        if v == "" or v == [] or (isinstance(v, list) and any(x == "" or x == [] for x in v)):
            raise ValueError("input must hold at least one non-empty text or token id list")
        return v

    def inputs(self) -> list[str | list[int]]:
        """The batch: a text, a list of texts, a list of token ids (one input) or of id lists."""
        v = self.input
        if isinstance(v, str):
            return [v]
        if all(isinstance(x, int) for x in v):
            return [list(v)]
        return list(v)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo
