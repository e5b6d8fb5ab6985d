"""DeepSeek-V3.2's sparse attention (DSA) over the paged latent + indexer-key cache.

The lightning indexer scores every earlier token of a request for each query t:

    index[t, s] = sum_h w[t, h] * relu(scale * q_idx[t, h] . k_idx[s])      (causal s <= t)

and the query attends (absorbed MLA, kernels/absorbed_mla_attention.py) only over the
index_topk tokens of highest score: all of them while its context is at most index_topk
(transformers' DeepseekV32Indexer picks topk over the causally masked scores; a -inf pick is
masked again, so a short context is dense). The indexer's keys live beside the latent rows in
one cache (kv_cache_interface.MLAIndexerAttentionSpec, block-major halves: dsa_cache_views).

The step's metadata is the MLA backends' (TorchAttentionMetadata: padded request groups); both
halves are read through each group's block table. Per query the selected latent rows are
gathered (index_topk x 576 values, 2.3 MB in bf16 for V3.2) and attended as one decode
request whose context is those rows (selected_group), by the absorbed backend's own decode
(csrc's mla_decode_attention for bf16 or int8 on CPU). So decode costs the indexer's one
matmul over the context's index keys (64 heads x 128 per key: 0.27G multiply-adds at 32k)
plus attention over 2,048 rows (128 heads x 2,048 x 1,088: 0.29G) instead of the whole
context (128 x 32k x 1,088: 4.6G).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch

from tacit.kernels.absorbed_mla_attention import SCORE_BLOCK_ELEMENTS, absorbed_attend
from tacit.kernels.kv_quant import SCALE_BYTES, pack_rows, unpack_rows
from tacit.kernels.torch_attention import (
    AttentionGroup,
    TorchAttentionMetadata,
    gather_blocks,
    pad_queries,
    run_groups,
    unpad_queries,
)
from tacit.kernels.torch_mla_attention import MLADims


def dsa_cache_views(
    kv_cache: torch.Tensor, block_size: int, latent_width: int, index_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_cache [blocks, block_size * (latent_width + index_width)] -> its latent rows
    [blocks, block_size, latent_width] and index rows [blocks, block_size, index_width]: views,
    so writes land in the cache and gather_blocks reads a block's half as one run."""
    nb = kv_cache.shape[0]
    if kv_cache.dim() != 2 or kv_cache.shape[1] != block_size * (latent_width + index_width):
        raise ValueError(
            f"a DSA cache is [blocks, block_size * (latent + index row)] = [*, {block_size * (latent_width + index_width)}]"
            f", got {tuple(kv_cache.shape)}"
        )
    split = block_size * latent_width
    latent = kv_cache[:, :split].view(nb, block_size, latent_width)
    index = kv_cache[:, split:].view(nb, block_size, index_width)
    return latent, index


def write_dsa_kv(
    latent_cache: torch.Tensor,
    index_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    latent: torch.Tensor,
    k_pe: torch.Tensor,
    index_key: torch.Tensor,
) -> None:
    """The step's normed latents [T, rank], rotated k_pe [T, rope] and index keys [T, D_idx] at
    their slots (int8: each part its own row with its scale, as MLAWriteKV stores the latent)."""
    bs = latent_cache.shape[1]
    block, offset = slot_mapping // bs, slot_mapping % bs
    if latent_cache.dtype == torch.int8:
        rows, keys = torch.cat([pack_rows(latent), pack_rows(k_pe)], dim=-1), pack_rows(index_key)
    else:
        rows, keys = torch.cat([latent, k_pe], dim=-1).to(latent_cache.dtype), index_key.to(index_cache.dtype)
    latent_cache[block, offset] = rows
    index_cache[block, offset] = keys


def _rows_as(rows: torch.Tensor, widths: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Cached rows [..., sum(widths) (+ a scale each in int8)] in `dtype` (int8: dequantized part by part)."""
    if rows.dtype != torch.int8:
        return rows.to(dtype)
    parts = rows.split([w + SCALE_BYTES for w in widths], dim=-1)
    return torch.cat([unpack_rows(p, dtype) for p in parts], dim=-1)


def index_scores(
    q_idx: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q_idx [R, Q, Hi, D], weights [R, Q, Hi] (float32), keys [R, L, D], mask [R, Q, L] (True:
    may attend) -> the indexer's scores [R, Q, L] float32, -inf where masked. The q.k products
    are one matmul in the keys' dtype (bf16 under a bf16 model: what the issue asks of decode;
    transformers computes them in float32, so a bf16 run may swap near-ties at the top-k edge)."""
    r, nq, hi, d = q_idx.shape
    raw = torch.bmm(q_idx.reshape(r, nq * hi, d).to(keys.dtype), keys.transpose(1, 2)).float()
    raw = torch.relu_(raw.mul_(scale)).view(r, nq, hi, -1)
    out = torch.matmul(weights.unsqueeze(-2), raw).squeeze(-2)  # [R, Q, L]: the heads' weighted sum
    return out.masked_fill_(~mask, float("-inf"))


def select_topk(scores: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [R, Q, L] -> (indices [R, Q, k], valid [R, Q, k]) with k = min(topk, L): a query
    with fewer than k attendable keys gets all of them, its other picks marked invalid."""
    values, indices = scores.topk(min(topk, scores.shape[-1]), dim=-1)
    return indices, values > float("-inf")


def gather_selected(latent_cache: torch.Tensor, block_tables: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """indices [R, Q, k] into each request's context (block_tables [R, B], in gather_blocks'
    order) -> the latent rows [R, Q, k, row] read straight from their blocks: only the selected
    rows are copied."""
    bs = latent_cache.shape[1]
    r = indices.shape[0]
    blocks = torch.gather(block_tables, 1, (indices // bs).reshape(r, -1)).view_as(indices)
    return latent_cache[blocks, indices % bs]


def selected_group(indices: torch.Tensor, valid: torch.Tensor, block_size: int) -> tuple[AttentionGroup, torch.Tensor]:
    """n queries' selections (indices, valid [n, k]; topk's descending order puts the invalid
    picks last) -> a decode group in which query i is request i whose context is its gathered
    rows: blocks [i * B, (i + 1) * B) of the gathered cache (k padded up to B whole blocks),
    its position its last valid row. Then the absorbed backend's decode (the C++ kernel over
    bf16 or int8 rows included) attends the selection as it would a whole context.
    Returns the group and the row index [n, B * block_size] to gather (padding repeats row 0,
    past every position)."""
    n, k = indices.shape
    blocks = -(-k // block_size)
    if blocks * block_size > k:
        indices = torch.cat([indices, indices[:, :1].expand(n, blocks * block_size - k)], dim=1)
        valid = torch.cat([valid, valid.new_zeros(n, blocks * block_size - k)], dim=1)
    ident = torch.arange(n, device=indices.device)
    group = AttentionGroup(
        token_index=None,
        query_pad_index=ident,
        query_unpad_index=ident,
        block_tables=torch.arange(n * blocks, device=indices.device).view(n, blocks),
        attn_mask=valid[:, None, None, :],
        num_reqs=n,
        max_query_len=1,
        decode_positions=valid.sum(-1) - 1,
    )
    return group, indices


# One slice of a group's padded queries: its requests, its query slots, and their selection.
Selection = tuple[slice, slice, torch.Tensor, torch.Tensor]


def index_selections(
    q_idx: torch.Tensor,
    idx_weights: torch.Tensor,
    g: AttentionGroup,
    index_cache: torch.Tensor,
    index_scale: float,
    topk: int,
    row_elements: int,
) -> Iterator[Selection]:
    """The indexer's top-k for one group's queries (q_idx [Tg, Hi, D], idx_weights [Tg, Hi]),
    yielded slice by slice of the padded [R, Q] queries, each attended before the next is made.
    A slice's scores, index keys and gathered rows (row_elements per selected key) stay within
    SCORE_BLOCK_ELEMENTS: a 32k prefill of V3.2's 64 index heads would otherwise score
    64 x 32k x 32k at once, and 64 decodes at 32k gather 512 MB of index keys."""
    qi, wi = pad_queries(q_idx, g), pad_queries(idx_weights, g)
    mask = g.attn_mask[:, 0]  # [R, Q, L]
    r, nq, hi = qi.shape[0], qi.shape[1], q_idx.shape[1]
    length = mask.shape[-1]
    per_query = max(hi * length, min(topk, length) * row_elements)
    q_step = max(1, min(nq, SCORE_BLOCK_ELEMENTS // per_query))
    r_step = max(1, SCORE_BLOCK_ELEMENTS // (per_query * q_step)) if q_step == nq else 1
    for r0 in range(0, r, r_step):
        rs = slice(r0, r0 + r_step)
        part = dataclasses.replace(g, block_tables=g.block_tables[rs])
        keys = _rows_as(gather_blocks(index_cache, part), (q_idx.shape[-1],), q_idx.dtype)  # [r, L, D]
        for q0 in range(0, nq, q_step):
            qs = slice(q0, q0 + q_step)
            scores = index_scores(qi[rs, qs], wi[rs, qs], keys, mask[rs, qs], index_scale)
            yield (rs, qs, *select_topk(scores, topk))


def sparse_attend(
    q: torch.Tensor,
    selections: Iterable[Selection],
    g: AttentionGroup,
    latent_cache: torch.Tensor,
    kv_b_proj: torch.Tensor,
    dims: MLADims,
    scale: float,
) -> torch.Tensor:
    """One group's queries q [Tg, H, nope + rope] -> [Tg, H, v]: absorbed MLA over only each
    query's selected rows (selected_group), slice by slice as index_selections cut them."""
    qp = pad_queries(q, g)
    r, nq = qp.shape[:2]
    bs, row = latent_cache.shape[1], latent_cache.shape[-1]
    out = q.new_empty(r, nq, dims.heads, dims.v)
    for rs, qs, indices, valid in selections:
        rr, n = indices.shape[0], indices.shape[0] * indices.shape[1]
        group, rows = selected_group(indices.reshape(n, -1), valid.reshape(n, -1), bs)
        ctx = gather_selected(latent_cache, g.block_tables[rs], rows.view(rr, -1, rows.shape[-1]))  # [r, q, k', row]
        attended = absorbed_attend(
            qp[rs, qs].reshape(n, dims.heads, -1), group, ctx.reshape(-1, bs, row), kv_b_proj, dims, scale
        )
        out[rs, qs] = attended.view(rr, -1, dims.heads, dims.v)
    return unpad_queries(out, g)


def sparse_mla_forward(
    query: torch.Tensor,
    q_idx: torch.Tensor | None,
    idx_weights: torch.Tensor | None,
    latent_cache: torch.Tensor,
    index_cache: torch.Tensor | None,
    meta: TorchAttentionMetadata,
    kv_b_proj: torch.Tensor,
    dims: MLADims,
    scale: float,
    index_scale: float,
    topk: int,
    carry: dict | None = None,
) -> torch.Tensor:
    """The step's queries [T, H, nope + rope], index queries [T, Hi, D] and head weights
    [T, Hi] (float32) -> [T, H, v], each query over its request's top-k tokens.

    carry: GLM-5's cross-layer top-k sharing. A layer with an indexer stores its selections
    there (with the step's metadata); a layer without one (q_idx None) attends the stored ones,
    as transformers' GlmMoeDsaAttention reuses the previous full layer's top-k."""
    if not isinstance(meta, TorchAttentionMetadata):
        raise TypeError(
            f"DSA attention reads the torch MLA backends' padded-group metadata (TorchAttentionMetadata), got "
            f"{type(meta).__name__}: run DeepSeek-V3.2 with the absorbed_mla or torch_mla backend"
        )
    shared = q_idx is None
    if shared and (carry is None or carry.get("meta") is not meta):
        raise RuntimeError("a layer that shares the top-k ran before any indexer layer of this step")
    if not shared and carry is not None:
        carry.clear()
        carry["meta"] = meta
    row_elements = latent_cache.shape[-1] + dims.heads

    def attend(q: torch.Tensor, g: AttentionGroup) -> torch.Tensor:
        if shared:
            selections = carry[id(g)]
        else:
            sel = slice(None) if g.token_index is None else g.token_index
            selections = index_selections(q_idx[sel], idx_weights[sel], g, index_cache, index_scale, topk, row_elements)
            if carry is not None:  # kept for the next layers: every slice's selection at once
                selections = carry[id(g)] = list(selections)
        return sparse_attend(q, selections, g, latent_cache, kv_b_proj, dims, scale)

    return run_groups(query, meta, dims.v, attend)
