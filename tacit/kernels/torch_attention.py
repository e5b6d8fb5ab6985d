"""Plain-torch paged attention: the reference every faster backend is checked against.

It gathers each request's context out of the block pool into a padded [R, L] batch and runs
one SDPA call with a causal/length mask, so a step costs one kernel launch per layer however
many requests it holds. The gather copies the whole context each step; a decode kernel that
reads blocks in place is the later optimization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tacit.forward_context import AttentionMetadata
from tacit.kernels.attention_backend import AttentionBackend


def gather_padded(flat_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[slots, ...] -> [R, L, ...]: each request's context positions in order."""
    return flat_cache[meta.kv_gather_index]


def pad_queries(x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[T, ...] -> [R, Q, ...]."""
    if meta.decode_only:
        return x.unsqueeze(1)
    return x[meta.query_pad_index].view(meta.num_reqs, meta.max_query_len, *x.shape[1:])


def unpad_queries(x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[R, Q, ...] -> [T, ...]."""
    if meta.decode_only:
        return x.squeeze(1)
    return x.reshape(meta.num_reqs * meta.max_query_len, *x.shape[2:])[meta.query_unpad_index]


def padded_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [R, L, Hkv, D*] -> [T, H, Dv]."""
    qp = pad_queries(q, meta).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        qp, k.transpose(1, 2), v.transpose(1, 2), attn_mask=meta.attn_mask, scale=scale,
        enable_gqa=q.shape[1] != k.shape[2],
    )
    return unpad_queries(out.transpose(1, 2), meta)


class TorchAttentionBackend(AttentionBackend):
    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata) -> None:
        flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
        flat[0].index_copy_(0, meta.slot_mapping, key.to(kv_cache.dtype))
        flat[1].index_copy_(0, meta.slot_mapping, value.to(kv_cache.dtype))

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
        k = gather_padded(flat[0], meta).to(query.dtype)
        v = gather_padded(flat[1], meta).to(query.dtype)
        return padded_sdpa(query, k, v, meta, scale)
