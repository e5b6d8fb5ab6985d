"""Plain-torch multi-head latent attention (DeepSeek-V3's MLA) over the paged latent cache.

The cache keeps MLA's compressed latent (kv_lora_rank + rope dim per token, 576 values for
V3) instead of full K and V (2 * 128 heads * 192 = 49152): 85x less cache per token. This
reference re-expands each request's gathered latents through kv_b_proj every step and runs
the same padded SDPA as the paged backend; absorbing kv_b_proj into q and o is the later,
faster backend.
"""

from __future__ import annotations

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


@register_attention_backend("torch_mla")
class TorchMLAAttentionBackend(TorchMetadataBackend, MLAAttentionBackend):
    priority = 100  # the reference

    def write_kv(
        self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: TorchAttentionMetadata
    ) -> None:
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        if kv_cache.dtype == torch.int8:  # latent and rotated key part, each with its scale
            rows = torch.cat([pack_rows(key), pack_rows(value)], dim=-1)
        else:
            rows = torch.cat([key, value], dim=-1).to(flat.dtype)
        flat.index_copy_(0, meta.slot_mapping, rows)

    def forward(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: TorchAttentionMetadata,
        scale: float,
        *,
        kv_b_proj: torch.Tensor,
    ) -> torch.Tensor:
        h = query.shape[1]
        kv_lora_rank = kv_b_proj.shape[1]
        quantized = kv_cache.dtype == torch.int8
        rope_dim = kv_cache.shape[-1] - kv_row_width(kv_lora_rank, kv_cache.dtype) - (SCALE_BYTES if quantized else 0)
        nope_dim = query.shape[-1] - rope_dim
        v_dim = kv_b_proj.shape[0] // h - nope_dim

        def attend(q: torch.Tensor, g: AttentionGroup) -> torch.Tensor:
            ctx = gather_blocks(kv_cache, g)  # [R, L, C + rope (+ scales)]
            if quantized:
                rows = ctx.split([kv_lora_rank + SCALE_BYTES, rope_dim + SCALE_BYTES], dim=-1)
                ctx_latent, ctx_pe = (unpack_rows(x, q.dtype) for x in rows)
            else:
                ctx_latent, ctx_pe = ctx.to(q.dtype).split([kv_lora_rank, rope_dim], dim=-1)
            r, length = ctx_latent.shape[:2]
            kv = F.linear(ctx_latent, kv_b_proj).view(r, length, h, nope_dim + v_dim)
            k_nope, v = kv.split([nope_dim, v_dim], dim=-1)
            k = torch.cat([k_nope, ctx_pe[:, :, None, :].expand(r, length, h, rope_dim)], dim=-1)
            return padded_sdpa(q, k, v, g, scale)

        return run_groups(query, meta, v_dim, attend)
