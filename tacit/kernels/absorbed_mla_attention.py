"""MLA with kv_b_proj absorbed into the query and the output: attention over the cached latent.

kv_b_proj [H * (nope + v), rank] splits per head into W_UK [H, nope, rank] and W_UV [H, v, rank].
A head's nope score q_nope . (W_UK latent) equals (q_nope W_UK) . latent, and its output
sum_l p_l (W_UV latent_l) equals W_UV (sum_l p_l latent_l). So with q_latent = q_nope W_UK:

    scores[t, h, l] = scale * (q_latent[t, h] . latent[l] + q_pe[t, h] . k_pe[l])
    o_latent[t, h] = softmax(scores[t, h]) @ latent          (rank values)
    out[t, h] = W_UV[h] o_latent[t, h]

and every head reads the same cached row (rank + rope values): MQA with one kv head of width
rank + rope, whose value is the row's first rank values. The context is never up-projected.

Which path is cheaper depends on the group's shape, not on prefill vs decode (mla_costs): a
decode against a long context skips up-projecting it (V3: 131k multiply-adds per context token
and head against 1.1k); a long fresh prefill up-projects about as many tokens as it absorbs
queries, and then attends at width 2 * rank + rope = 1,088 instead of nope + rope + v = 320.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import ModuleType

import torch

from tacit.kernels.attention_backend import MLAAttentionBackend, register_attention_backend
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.kv_quant import SCALE_BYTES, unpack_rows
from tacit.kernels.torch_attention import (
    AttentionGroup,
    TorchAttentionMetadata,
    TorchMetadataBackend,
    gather_blocks,
    pad_queries,
    run_groups,
    unpad_queries,
)
from tacit.kernels.torch_mla_attention import MLADims, MLAWriteKV, naive_attend

# Largest fp32 score block materialized at once (elements): 16M = 64 MB, so a 170-token chunk of
# V3's 128 heads against a 32k context (2.8 GB of scores) runs in slices instead.
SCORE_BLOCK_ELEMENTS = 1 << 24


def mla_costs(num_tokens: int, num_reqs: int, max_query_len: int, keys_per_req: int, dims: MLADims) -> tuple[int, int]:
    """Multiply-adds of one attention group by (naive, absorbed).

    The group attends num_reqs x max_query_len padded query slots (num_tokens real ones) to
    keys_per_req keys each (padded context, this step's tokens included). Per head:

    naive:    up-project every key          keys * rank * (nope + v)
              scores and weighted values    slots * keys * (nope + rope + v)
    absorbed: absorb each query and output  tokens * rank * (nope + v)
              scores and weighted latents   slots * keys * (rank + rope + rank)

    V3 (rank 512, nope 128, rope 64, v 128), one decode against 4k keys: naive 538M, absorbed
    4.6M per head. A fresh 2k-token prefill: naive 1.6G, absorbed 4.8G per head.

    The count picks the faster path in wall time too (random:deepseek-v3-1b's 16 heads, bf16, one
    thread, absorbed/naive ms): a chunk after 4,096 cached tokens of 16 tokens 31/181, 64 tokens
    119/244, 160 tokens 302/338 (absorbed picked), 250 tokens 479/419 (naive picked); a fresh
    512-token prompt 129/57 (naive picked).
    """
    keys = num_reqs * keys_per_req
    attended = num_reqs * max_query_len * keys_per_req
    project = dims.rank * (dims.nope + dims.v)
    naive = keys * project + attended * (dims.nope + dims.rope + dims.v)
    absorbed = num_tokens * project + attended * (2 * dims.rank + dims.rope)
    return naive * dims.heads, absorbed * dims.heads


def prefers_absorbed(num_tokens: int, num_reqs: int, max_query_len: int, keys_per_req: int, dims: MLADims) -> bool:
    naive, absorbed = mla_costs(num_tokens, num_reqs, max_query_len, keys_per_req, dims)
    return absorbed < naive


@dataclass
class _Split:
    ref: weakref.ref
    version: tuple[int, int]
    w_uk: torch.Tensor  # [H, nope, rank]
    w_uv_t: torch.Tensor  # [H, rank, v]: W_UV transposed, the right operand of o_latent [H, T, rank]


_SPLITS: dict[int, _Split] = {}


def absorbed_weights(kv_b_proj: torch.Tensor, dims: MLADims) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UK [H, nope, rank] and W_UV^T [H, rank, v], split once per weight tensor.

    Keyed on the tensor itself (id, held weakly: a freed model's split goes with it) and
    re-split when its storage or version counter moves (an in-place load or copy_). Contiguous
    copies rather than views of kv_b_proj: bf16 bmm over the strided views measured 4-13x slower
    (128 heads x 1 token, one thread: 3.9 and 11.1 ms against 1.0 and 0.8 ms). The price is a
    second kv_b_proj per layer (V3: 34 MB, 2 GB over its 61 layers)."""
    key = id(kv_b_proj)
    # A tensor made under torch.inference_mode keeps no version counter (reading it raises).
    version = (-1 if kv_b_proj.is_inference() else kv_b_proj._version, kv_b_proj.data_ptr())
    s = _SPLITS.get(key)
    if s is None or s.ref() is not kv_b_proj or s.version != version:
        w = kv_b_proj.detach().view(dims.heads, dims.nope + dims.v, dims.rank)

        def forget(r: weakref.ref, key: int = key) -> None:
            if key in _SPLITS and _SPLITS[key].ref is r:
                del _SPLITS[key]

        s = _Split(
            ref=weakref.ref(kv_b_proj, forget),
            version=version,
            w_uk=w[:, : dims.nope].contiguous(),
            w_uv_t=w[:, dims.nope :].transpose(1, 2).contiguous(),
        )
        _SPLITS[key] = s
    return s.w_uk, s.w_uv_t


def gather_latent_rows(kv_cache: torch.Tensor, g: AttentionGroup, dims: MLADims) -> torch.Tensor:
    """The group's cached rows [R, L, rank + rope] in float32 (int8: dequantized)."""
    ctx = gather_blocks(kv_cache, g)
    if kv_cache.dtype == torch.int8:
        rows = ctx.split([dims.rank + SCALE_BYTES, dims.rope + SCALE_BYTES], dim=-1)
        return torch.cat([unpack_rows(x, torch.float32) for x in rows], dim=-1)
    return ctx.float()


def latent_attention(q: torch.Tensor, ctx: torch.Tensor, mask: torch.Tensor, scale: float, rank: int) -> torch.Tensor:
    """q [R, Q, H, rank + rope], ctx [R, L, rank + rope], mask [R, Q, L] (True: attend), all float32
    -> o_latent [R, Q, H, rank]. Every head of a request shares its ctx rows, so a request is one
    [Q*H, rank + rope] x [rank + rope, L] matmul; sliced so no score block tops SCORE_BLOCK_ELEMENTS."""
    r, nq, h, width = q.shape
    length = ctx.shape[1]
    out = q.new_empty(r, nq, h, rank)
    per_query = h * length
    q_step = max(1, min(nq, SCORE_BLOCK_ELEMENTS // per_query))
    r_step = max(1, SCORE_BLOCK_ELEMENTS // (per_query * q_step)) if q_step == nq else 1
    hidden = ~mask
    for r0 in range(0, r, r_step):
        rs = slice(r0, r0 + r_step)
        keys, values = ctx[rs].transpose(1, 2), ctx[rs, :, :rank]
        for q0 in range(0, nq, q_step):
            qs = slice(q0, q0 + q_step)
            qb = q[rs, qs]
            n = qb.shape[0]
            scores = torch.bmm(qb.reshape(n, -1, width), keys).view(n, -1, h, length)
            scores.mul_(scale).masked_fill_(hidden[rs, qs, None, :], float("-inf"))
            probs = torch.softmax(scores, dim=-1).view(n, -1, length)
            out[rs, qs] = torch.bmm(probs, values).view(n, -1, h, rank)
    return out


def decode_kernel(q: torch.Tensor, kv_cache: torch.Tensor, g: AttentionGroup) -> ModuleType | None:
    """The C++ kernels when this group can run csrc's latent decode (bf16 queries on a bf16 or
    int8 cache, CPU, one query per request), else None. Checked in that order so float32 runs
    never build them."""
    if not (
        g.decode_only
        and q.dtype == torch.bfloat16
        and kv_cache.dtype in (torch.bfloat16, torch.int8)
        and kv_cache.device.type == "cpu"
    ):
        return None
    return load_cpu_kernels()


def absorbed_attend(
    q: torch.Tensor, g: AttentionGroup, kv_cache: torch.Tensor, kv_b_proj: torch.Tensor, dims: MLADims, scale: float
) -> torch.Tensor:
    """q [Tg, H, nope + rope] -> [Tg, H, v] through the absorbed weights. Scores, softmax and the
    weighted latents in float32 whatever the model dtype; the two per-head projections in it.

    bf16 decodes on a CPU with the AVX512-BF16 kernels read the cache in place instead
    (csrc/decode_attention_op.cpp mla_decode_attention; an int8 cache's scales applied inside
    csrc/decode_attention_int8.cpp): no gather, no float32 copy of the context.
    random:deepseek-v3-1b's attention (16 heads) at 4k context, one thread, one layer call: 1.5
    ms against 4.6 ms for one request, 12.6 ms against 105 ms for eight. Over an int8 cache
    (docs/benchmarks.md, the attention alone): 0.55 ms against 1.05 for the bf16 kernel and
    3.6-8.6 for the torch path (it dequantizes the whole context to float32 first) for one
    request; 4.5 ms against 8.1 and 102 for eight."""
    w_uk, w_uv_t = absorbed_weights(kv_b_proj, dims)
    q_nope, q_pe = q.split([dims.nope, dims.rope], dim=-1)
    kernels = decode_kernel(q, kv_cache, g)
    if kernels is not None and head_bmm_fits(w_uk, w_uv_t):
        # per-head bf16 products from csrc/head_bmm.cpp: torch.bmm streamed these weights at ~15
        # GB/s for a few tokens (random:deepseek-v3-1b: 1.6 of 8.9 ms a decoded token)
        q_latent = kernels.head_bmm_bf16(q_nope, w_uk)  # [Tg, H, rank]
        q_abs = torch.cat([q_latent, q_pe], dim=-1)
        o_latent = kernels.mla_decode_attention(q_abs, kv_cache, g.decode_positions, g.block_tables, scale, dims.rank)
        return kernels.head_bmm_bf16(o_latent, w_uv_t)
    q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [Tg, H, rank]
    if kernels is not None:
        q_abs = torch.cat([q_latent, q_pe], dim=-1)
        o_latent = kernels.mla_decode_attention(q_abs, kv_cache, g.decode_positions, g.block_tables, scale, dims.rank)
    else:
        q_abs = torch.cat([q_latent.float(), q_pe.float()], dim=-1)
        ctx = gather_latent_rows(kv_cache, g, dims)
        o_latent = latent_attention(pad_queries(q_abs, g), ctx, g.attn_mask[:, 0], scale, dims.rank)
        o_latent = unpad_queries(o_latent, g).to(q.dtype)  # [Tg, H, rank]
    return torch.bmm(o_latent.transpose(0, 1), w_uv_t).transpose(0, 1)


def head_bmm_fits(*weights: torch.Tensor) -> bool:
    """csrc/head_bmm.cpp takes [H, K, N] bf16 weights with K even and N a multiple of 32."""
    return all(w.dtype == torch.bfloat16 and w.shape[1] % 2 == 0 and w.shape[2] % 32 == 0 for w in weights)


@register_attention_backend("absorbed_mla")
class AbsorbedMLAAttentionBackend(MLAWriteKV, TorchMetadataBackend, MLAAttentionBackend):
    priority = 50  # ahead of the torch_mla reference: same math, decode never up-projects the context

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
        block_size = kv_cache.shape[1]

        def attend(q: torch.Tensor, g: AttentionGroup) -> torch.Tensor:
            keys = g.block_tables.shape[1] * block_size
            if prefers_absorbed(q.shape[0], g.num_reqs, g.max_query_len, keys, dims):
                return absorbed_attend(q, g, kv_cache, kv_b_proj, dims, scale)
            return naive_attend(q, g, kv_cache, kv_b_proj, dims, scale)

        return run_groups(query, meta, dims.v, attend)
