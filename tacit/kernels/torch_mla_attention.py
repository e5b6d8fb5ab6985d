"""Plain-torch multi-head latent attention (DeepSeek-V3's MLA) over the paged latent cache.

The cache keeps MLA's compressed latent (kv_lora_rank + rope dim per token, 576 values for
V3) instead of full K and V (2 * 128 heads * 192 = 49152): 85x less cache per token. This
reference re-expands each request's gathered latents through kv_b_proj every step and runs
the same padded SDPA as the paged backend; kernels/absorbed_mla_attention.py absorbs
kv_b_proj into q and o instead, and falls back to this path where re-expanding is cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tacit.kernels.attention_backend import MLAAttentionBackend, register_attention_backend
from tacit.kernels.kv_quant import SCALE_BYTES, kv_row_width, pack_rows, unpack_rows
from tacit.kernels.torch_attention import (
    AttentionGroup,
    TorchAttentionMetadata,
    TorchMetadataBackend,
    gather_blocks,
    padded_sdpa,
    run_groups,
)


@dataclass(frozen=True)
class MLADims:
    """One MLA layer's widths, read off the tensors a backend is handed."""

    heads: int
    rank: int  # kv_lora_rank: the cached latent's width
    rope: int  # the rotated key part shared by every head
    nope: int  # each head's key part that comes from the latent
    v: int  # each head's value width

    @classmethod
    def of(cls, query: torch.Tensor, kv_cache: torch.Tensor, kv_b_proj: torch.Tensor) -> MLADims:
        """query [T, H, nope + rope], kv_cache [blocks, block_size, row], kv_b_proj [H * (nope + v), rank]."""
        h, rank = query.shape[1], kv_b_proj.shape[1]
        quantized = kv_cache.dtype == torch.int8
        rope = kv_cache.shape[-1] - kv_row_width(rank, kv_cache.dtype) - (SCALE_BYTES if quantized else 0)
        nope = query.shape[-1] - rope
        return cls(heads=h, rank=rank, rope=rope, nope=nope, v=kv_b_proj.shape[0] // h - nope)


def gather_latent(
    kv_cache: torch.Tensor, g: AttentionGroup, dims: MLADims, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's cached latents [R, L, rank] and rotated key parts [R, L, rope] in `dtype`."""
    ctx = gather_blocks(kv_cache, g)  # [R, L, rank + rope (+ scales)]
    if kv_cache.dtype == torch.int8:
        rows = ctx.split([dims.rank + SCALE_BYTES, dims.rope + SCALE_BYTES], dim=-1)
        latent, k_pe = (unpack_rows(x, dtype) for x in rows)
        return latent, k_pe
    latent, k_pe = ctx.to(dtype).split([dims.rank, dims.rope], dim=-1)
    return latent, k_pe


def naive_attend(
    q: torch.Tensor, g: AttentionGroup, kv_cache: torch.Tensor, kv_b_proj: torch.Tensor, dims: MLADims, scale: float
) -> torch.Tensor:
    """q [Tg, H, nope + rope] -> [Tg, H, v]: the context up-projected to full K/V, then SDPA."""
    ctx_latent, ctx_pe = gather_latent(kv_cache, g, dims, q.dtype)
    r, length = ctx_latent.shape[:2]
    h, rope = dims.heads, dims.rope
    kv = F.linear(ctx_latent, kv_b_proj).view(r, length, h, dims.nope + dims.v)
    k_nope, v = kv.split([dims.nope, dims.v], dim=-1)
    k = torch.cat([k_nope, ctx_pe[:, :, None, :].expand(r, length, h, rope)], dim=-1)
    return padded_sdpa(q, k, v, g, scale)


class MLAWriteKV:
    """How every MLA backend stores a step's latents: one row per token, the normed latent
    then the rotated key part (int8: each followed by its scale's 4 bytes)."""

    def write_kv(
        self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: TorchAttentionMetadata
    ) -> None:
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        if kv_cache.dtype == torch.int8:  # latent and rotated key part, each with its scale
            rows = torch.cat([pack_rows(key), pack_rows(value)], dim=-1)
        else:
            rows = torch.cat([key, value], dim=-1).to(flat.dtype)
        flat.index_copy_(0, meta.slot_mapping, rows)


@register_attention_backend("torch_mla")
class TorchMLAAttentionBackend(MLAWriteKV, TorchMetadataBackend, MLAAttentionBackend):
    priority = 100  # the reference

    def forward(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: TorchAttentionMetadata,
        scale: float,
        *,
        kv_b_proj: torch.Tensor,
    ) -> torch.Tensor:
        dims = MLADims.of(query, kv_cache, kv_b_proj)
        return run_groups(query, meta, dims.v, lambda q, g: naive_attend(q, g, kv_cache, kv_b_proj, dims, scale))
