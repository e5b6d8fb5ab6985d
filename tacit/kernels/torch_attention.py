"""Plain-torch paged attention: the reference every faster backend is checked against.

It gathers each request's blocks out of the pool into a padded [R, B*block_size] batch and
runs one SDPA call with a causal/length mask, so a step costs one kernel launch per layer
however many requests it holds. Gathering whole blocks (16 rows, 6 KB each for SmolLM2's
K) instead of single slots turns L small copies into L/16 large ones. It still copies the
whole context each step; a decode kernel that reads blocks in place is the later step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from typing import Callable

from tacit.forward_context import AttentionGroup, AttentionMetadata
from tacit.kernels.attention_backend import AttentionBackend


def gather_blocks(cache: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """[blocks, block_size, ...] -> [R, B*block_size, ...]: each request's context in order."""
    # index_select over whole rows is a memcpy per block: 30 us for 16 requests x 13 blocks of
    # SmolLM2's K here, against 143 us for the same gather as advanced indexing.
    r, b = group.block_tables.shape
    rows = torch.index_select(cache.reshape(cache.shape[0], -1), 0, group.block_tables.reshape(-1))
    return rows.view(r, b * cache.shape[1], *cache.shape[2:])


def pad_queries(x: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """[T, ...] -> [R, Q, ...]."""
    if group.decode_only:
        return x.unsqueeze(1)
    return x[group.query_pad_index].view(group.num_reqs, group.max_query_len, *x.shape[1:])


def unpad_queries(x: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """[R, Q, ...] -> [T, ...]."""
    if group.decode_only:
        return x.squeeze(1)
    return x.reshape(group.num_reqs * group.max_query_len, *x.shape[2:])[group.query_unpad_index]


def padded_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: AttentionGroup, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [R, L, Hkv, D*] -> [T, H, Dv]."""
    qp = pad_queries(q, group).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        qp, k.transpose(1, 2), v.transpose(1, 2), attn_mask=group.attn_mask, scale=scale,
        enable_gqa=q.shape[1] != k.shape[2],
    )
    return unpad_queries(out.transpose(1, 2), group)


def run_groups(query: torch.Tensor, meta: AttentionMetadata, out_dim: int,
               attend: Callable[[torch.Tensor, AttentionGroup], torch.Tensor]) -> torch.Tensor:
    """attend(group queries, group) per group (at most two: decodes, prefills), scattered back."""
    if len(meta.groups) == 1 and meta.groups[0].token_index is None:
        return attend(query, meta.groups[0])
    out = query.new_empty(query.shape[0], query.shape[1], out_dim)
    for g in meta.groups:
        out[g.token_index] = attend(query[g.token_index], g)
    return out


class TorchAttentionBackend(AttentionBackend):
    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata) -> None:
        flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
        flat[0].index_copy_(0, meta.slot_mapping, key.to(kv_cache.dtype))
        flat[1].index_copy_(0, meta.slot_mapping, value.to(kv_cache.dtype))

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        def attend(q: torch.Tensor, g: AttentionGroup) -> torch.Tensor:
            k = gather_blocks(kv_cache[0], g).to(q.dtype)
            v = gather_blocks(kv_cache[1], g).to(q.dtype)
            return padded_sdpa(q, k, v, g, scale)

        return run_groups(query, meta, kv_cache.shape[-1], attend)
