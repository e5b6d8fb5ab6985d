"""A token-embedding table kept in its GGUF file's GGML blocks, rows dequantized as looked up.

Decode looks up one row per token, so a dequantized table is memory held for nothing: the
default model's Q8_0 token_embd is 30 MB in its blocks and 57 MB in bf16. Kept in blocks, a tied
lm_head (a GGMLLinearMethod layer of the same type) shares the very same tensor, so the table is
held once, not as a bf16 lookup copy plus the head's blocks. Lookups dequantize the gathered rows
with the same arithmetic as the dequantized table (the kernels' bf16 rounding of d * q, or the
torch reference), so the looked-up values do not change.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from tacit.kernels.ggml_quant import GGML_TYPES, dequantize, row_bytes


class GGMLEmbedding(nn.Module):
    def __init__(
        self, num_embeddings: int, embedding_dim: int, ggml_type: int, dtype: torch.dtype, kernels: ModuleType | None
    ) -> None:
        super().__init__()
        if ggml_type not in GGML_TYPES:
            raise ValueError(f"GGML type {ggml_type} has no native embedding")
        self.num_embeddings, self.embedding_dim, self.ggml_type = num_embeddings, embedding_dim, ggml_type
        self.dtype, self.kernels = dtype, kernels
        data = torch.empty(num_embeddings, row_bytes(ggml_type, embedding_dim), dtype=torch.uint8)
        self.weight = nn.Parameter(data, requires_grad=False)

    @classmethod
    def for_type(
        cls,
        ggml_type: int,
        num_embeddings: int,
        embedding_dim: int,
        platform: str,
        dtype: torch.dtype,
        cpu_kernels: bool | None = None,
    ) -> GGMLEmbedding:
        """cpu_kernels: the engine's ModelConfig.cpu_kernels (None: the environment's default)."""
        kernels = None
        if platform == "cpu" and dtype == torch.bfloat16:
            from tacit.kernels.cpu_kernels import load_cpu_kernels

            kernels = load_cpu_kernels(cpu_kernels)
        return cls(num_embeddings, embedding_dim, ggml_type, dtype, kernels)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.index_select(0, ids.reshape(-1))
        if self.kernels is not None:
            out = self.kernels.ggml_dequantize(rows, self.ggml_type, self.embedding_dim)
        else:
            out = dequantize(rows, self.ggml_type, self.embedding_dim).to(self.dtype)
        return out.view(*ids.shape, self.embedding_dim)
