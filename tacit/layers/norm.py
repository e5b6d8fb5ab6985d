from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # One fused kernel instead of HF's six elementwise ops (28 us against 46 us for a
            # 576-wide row here; a SmolLM2 decode step runs 61 norms). Same math in float32.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # bf16/fp16: HF's order exactly (statistics in float32, cast, then scale). The fused
        # kernel alone rounds once instead of twice, and that 1-ulp drift was enough to turn the
        # default Q4_1 SmolLM2's "Paris" into a wrong answer (tests/loader/test_gguf.py).
        normed = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * normed.to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x * (1 + w), the weight stored as an offset from 1 (a checkpoint's zeros
    are the identity). The whole product runs in float32 and is cast once at the end, as
    transformers' Gemma3RMSNorm does (Llama's casts before scaling: the two differ by an ulp in
    bf16)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)
