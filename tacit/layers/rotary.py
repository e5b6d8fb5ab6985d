"""Rotary position embedding with the scalings real checkpoints ask for (llama3, yarn, linear)."""

from __future__ import annotations

import math
from typing import Any

import torch


def _llama3_inv_freq(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor = p["factor"]
    low, high = p.get("low_freq_factor", 1.0), p.get("high_freq_factor", 4.0)
    old_ctx = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, base: float, p: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    orig = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / orig
    mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
    attn_factor = p.get("attention_factor")
    if attn_factor is None:
        attn_factor = (
            yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
            if mscale and mscale_all
            else yarn_mscale(factor)
        )
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rot: float) -> float:
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attn_factor)


def compute_inv_freq(dim: int, rope: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, cos/sin scale) for a rope dict normalized by config.normalize_rope."""
    base = float(rope["rope_theta"])
    kind = rope["rope_type"]
    if kind == "yarn":
        return _yarn_inv_freq(dim, base, rope, max_pos)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, rope), 1.0
    if kind == "linear":
        return inv_freq / rope["factor"], 1.0
    raise ValueError(f"rope_type={kind!r} is not supported; valid: default, linear, llama3, yarn")


def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotation (HF rotate_half). x [T, H, D]; cos/sin [T, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairwise (x0,x1),(x2,x3)... rotation as DeepSeek lays it out; output is de-interleaved,
    the same for q and k, so their dot products are those of the interleaved form."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, rotary_dim: int, max_position: int, rope: dict[str, Any], interleaved: bool = False) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = compute_inv_freq(rotary_dim, rope, max_position)
        self.inv_freq = inv_freq
        self.interleaved = interleaved
        self._rotate = rotate_interleaved if interleaved else rotate_neox

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        return (freqs.cos() * self.attention_scaling).to(dtype), (freqs.sin() * self.attention_scaling).to(dtype)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self._rotate(x, cos, sin)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # cos/sin come from cos_sin(), computed once per step by the model, not once per layer.
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)
