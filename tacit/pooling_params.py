"""PoolingParams: how an embedding request turns its prompt's final hidden states into one vector
(vLLM's name), validated where the user sets it.

LAST takes the last prompt token's hidden state (decoder embedding models: Qwen3-Embedding,
gte-Qwen2, e5-mistral; their last token has attended to every other), MEAN the average over
every prompt token, CLS the first token's. `dimensions` keeps the first N values before
normalising (a Matryoshka model's shorter embedding, OpenAI's field); `normalize` divides by the
L2 norm, as sentence-transformers does for these models.
"""

from __future__ import annotations

from dataclasses import dataclass

POOLING_TYPES = ("LAST", "MEAN", "CLS")


@dataclass(frozen=True)
class PoolingParams:
    pooling_type: str = "LAST"
    normalize: bool = True
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"PoolingParams.pooling_type={self.pooling_type!r} is invalid: one of {', '.join(POOLING_TYPES)}"
            )
        if self.normalize is not True and self.normalize is not False:
            raise ValueError(f"PoolingParams.normalize={self.normalize!r} is invalid: must be true or false")
        d = self.dimensions
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 1):
            raise ValueError(f"PoolingParams.dimensions={d!r} is invalid: must be an integer >= 1 or None")

    @property
    def reads_every_token(self) -> bool:
        """Whether the pool needs every prompt token computed (MEAN, CLS): such a request reads no
        prefix-cache hit, whose tokens it would never see. LAST needs only the last token, which a
        hit always leaves to compute."""
        return self.pooling_type != "LAST"
