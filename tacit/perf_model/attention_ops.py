"""Attention's operators of one step on one device: the projections, then attention over the
cached keys. GQA attention, over every cached key or (a sliding-window layer) over the last
`window` positions; MLA's latent attention, over every cached token or (DeepSeek-V3.2's DSA)
over the index_topk tokens its lightning indexer selects, the indexer scanning every cached
token's index key to select them. Gemma 3's and gpt-oss's other differences move no bytes
worth counting: gpt-oss's sinks are one logit per head (64 values a layer), its router bias
one add per expert, its qkv bias 5,120 values beside 2880 x 5120 weights; Gemma 3's extra
norms are two more RMSNorms over the hidden state a layer."""

from __future__ import annotations

from tacit.kernels.absorbed_mla_attention import mla_costs
from tacit.kernels.torch_mla_attention import MLADims
from tacit.perf_model.dtypes import gemm_compute_dtype, kv_bytes_per_row, weight_bytes_per_value
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.op_types import ACT, Op, Parallel, StepShape, gemm_op, local_heads


def attended_keys(step: StepShape, limit: int = 0) -> float:
    """Sum over the step's queries of the keys each attends to, when none attends to more than
    `limit` (0: no limit). The query at 1-based position n attends min(n, limit): a sliding
    window of W (transformers' mask: key j visible from query i when i - j < W) covers the
    query's own position and the W - 1 before it; DSA attends its index_topk best of the n."""
    t, c = step.new_tokens, step.context
    if not limit or c + t <= limit:
        return step.key_positions
    below = max(0, min(t, limit - c))  # queries at positions c+1 .. limit attend all theirs
    return step.batch * (below * c + below * (below + 1) / 2 + (t - below) * limit)


def rows_read(step: StepShape, limit: int = 0) -> float:
    """Cached rows the step reads, its new ones included: every row without a limit; under a
    window of W the W - 1 positions before the step's first query and the step's own,
    min(C + T, W - 1 + T) a sequence (a decode step: min(C + 1, W)). Counted in rows, not in
    the blocks a paged kernel touches (a 128-token window straddles at most 9 blocks of 16:
    144 rows), as every count here is the least the step must move. DSA's decode reads its
    min(C + 1, index_topk) selected latent rows: the same count."""
    total = step.context + step.new_tokens
    return step.batch * (total if not limit else min(total, limit - 1 + step.new_tokens))


def attention_ops(
    s: ModelShape, step: StepShape, par: Parallel, wdt: str, kvdt: str, group: int, act: str = "auto"
) -> list[Op]:
    """`act`: the quantized linears' activation dtype (dtypes.activation_dtype)."""
    step = par.attention_step(step)
    dts = s.tensor_dtypes(wdt)
    wdt = dts.linear  # attention is never in an experts-only dtype
    L, m, h = s.num_layers, step.tokens, s.hidden_size
    hq = local_heads(s.num_heads, par.attention_tp)
    if s.is_mla:
        return _mla_ops(s, step, hq, wdt, kvdt, group, act, dts.kv_b)
    d, hkv = s.head_dim, local_heads(s.num_kv_heads, par.attention_tp)
    ops = [
        gemm_op("qkv_proj", "attn_proj", m, h, (hq + 2 * hkv) * d, wdt, group, L, act),
        gemm_op("o_proj", "attn_proj", m, hq * d, h, wdt, group, L, act),
    ]
    kv_row = 2 * hkv * kv_bytes_per_row(kvdt, d)  # K and V of one token
    written = m * kv_row
    qo = m * 2 * hq * d * ACT
    windows = s.layer_counts
    sliding = [w for w in windows if w]
    for window, layers in windows.items():
        # scores (q.k) and the weighted sum of values: 2 FLOPs per multiply-add each, per head and key
        flops = 4 * hq * d * attended_keys(step, window)
        cached = rows_read(step, window) * kv_row  # read once per sequence
        name = "attention" if not window else "sliding_attention" + (f"_{window}" if len(sliding) > 1 else "")
        # rows: a prefill's query tokens per sequence, the prefill attention curve's x
        nbytes = layers * (cached + written + qo)
        ops.append(
            Op(
                name, "attention", layers * flops, nbytes, step.new_tokens, launches=layers, layers=layers,
                gqa_group=hq / hkv,
            )
        )  # fmt: skip
    return ops


def _mla_ops(
    s: ModelShape, step: StepShape, hq: int, wdt: str, kvdt: str, group: int, act: str = "auto", kvb: str = "bf16"
) -> list[Op]:
    """MLA: the latent cache holds kv_lora_rank + qk_rope_head_dim values per token. Decode runs
    the absorbed path (q absorbed into the latent space by kv_b_proj's K half, attention over the
    latent in place, the V half applied after); a prefill up-projects the latent to per-head K and
    V and attends as usual. kv_b_proj in `kvb`, the checkpoint's (dtypes.tensor_dtypes: DeepSeek-V3's
    fp8 stores it fp8; tacit's own int8/int4 keep it bf16, read directly: dense_weight_linears).
    DSA (index_topk > 0): the indexer's operators, then each query's attention over at most
    index_topk keys; a prefill still up-projects every cached token (the naive path, which
    masks each query to its selection)."""
    L, m, h = s.num_layers, step.tokens, s.hidden_size
    nope, rope, v, lat = s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.kv_lora_rank
    qk, topk = nope + rope, s.index_topk
    ops = []
    if s.q_lora_rank:
        ops.append(gemm_op("q_a_proj", "attn_proj", m, h, s.q_lora_rank, wdt, group, L, act))
        ops.append(gemm_op("q_b_proj", "attn_proj", m, s.q_lora_rank, hq * qk, wdt, group, L, act))
    else:
        ops.append(gemm_op("q_proj", "attn_proj", m, h, hq * qk, wdt, group, L, act))
    ops.append(gemm_op("kv_a_proj", "attn_proj", m, h, lat + rope, wdt, group, L, act))
    ops.append(gemm_op("o_proj", "attn_proj", m, hq * v, h, wdt, group, L, act))
    if s.is_dsa:
        ops += indexer_ops(s, step, wdt, kvdt, group, act)
    latent_row = kv_bytes_per_row(kvdt, lat + rope)
    written = m * latent_row
    kvb_weight = lat * hq * (nope + v) * weight_bytes_per_value(kvb, group, "attn_v", L, lat)
    keys = attended_keys(step, topk)
    if step.new_tokens == 1 or _engine_absorbs(s, step, hq):  # absorbed: decode, or a short chunk on a long context
        absorb = 2 * m * hq * lat * (nope + v)  # q_nope -> latent, and latent -> v per head
        ops.append(
            Op(
                "kv_b_absorbed",
                "attn_proj",
                L * absorb,
                L * (kvb_weight + m * hq * lat * 2 * ACT),
                m,
                kvb,
                is_gemm=True,
                kernel="bmm",
                act_dtype=gemm_compute_dtype(kvb, act),
            )
        )
        flops = 2 * hq * (lat + rope) * keys + 2 * hq * lat * keys
        cached = rows_read(step, topk) * latent_row
        name = "attention_sparse" if topk else "attention_latent"
        ops.append(Op(name, "attention", L * flops, L * (cached + written + m * hq * 2 * lat * ACT), m, layers=L))
    else:  # naive prefill: up-project every cached and new token's latent
        all_keys = step.batch * (step.context + step.new_tokens)
        ops.append(gemm_op("kv_b_proj", "attn_proj", all_keys, lat, hq * (nope + v), kvb, group, L, act))
        flops = 2 * hq * qk * keys + 2 * hq * v * keys
        kv = all_keys * hq * (qk + v) * ACT
        nbytes = L * (all_keys * latent_row + written + kv + m * hq * (qk + v) * ACT)
        ops.append(Op("attention", "attention", L * flops, nbytes, step.new_tokens, kernel="mla", layers=L))
    return ops


def _engine_absorbs(s: ModelShape, step: StepShape, hq: int) -> bool:
    """Whether the engine's MLA backend runs this chunk absorbed: it picks the path of fewer
    multiply-adds (absorbed_mla_attention.mla_costs), so a few rows on a long context (an MTP
    draft's settled tokens, a small prefill chunk) go absorbed as a decode does. DSA's sparse
    backend always up-projects a prefill."""
    if s.is_dsa:
        return False
    dims = MLADims(heads=hq, rank=s.kv_lora_rank, rope=s.qk_rope_head_dim, nope=s.qk_nope_head_dim, v=s.v_head_dim)
    t = round(step.new_tokens)
    naive, absorbed = mla_costs(step.batch * t, step.batch, t, round(step.context) + t, dims)
    return absorbed < naive


def indexer_ops(s: ModelShape, step: StepShape, wdt: str, kvdt: str, group: int, act: str = "auto") -> list[Op]:
    """DeepSeek-V3.2's lightning indexer, every layer: its q projection from MLA's q_lora
    activation (wq_b), its one key a token from the hidden state (wk), the per-head weights
    (weights_proj, kept bf16 as the checkpoint keeps it), then every query's score against every
    cached index key (index_n_heads dot products of index_head_dim, a ReLU and the heads' weighted
    sum: 2 * H * D + 2 * H FLOPs a key) and the top-k over those float32 scores (written, read
    back, index_topk int32 indices out). The indexer is whole on every rank, as the latent is."""
    L, m, h = s.num_layers, step.tokens, s.hidden_size
    nh, d = s.index_n_heads, s.index_head_dim
    ops = [
        gemm_op("index_q_proj", "attn_proj", m, s.q_lora_rank or h, nh * d, wdt, group, L, act),
        gemm_op("index_k_proj", "attn_proj", m, h, d, wdt, group, L, act),
        gemm_op("index_weights_proj", "attn_proj", m, h, nh, "bf16", group, L, act),
    ]
    keys = step.key_positions  # every query scores every key before it (causal)
    row = kv_bytes_per_row(kvdt, d)
    cached = step.batch * (step.context + step.new_tokens) * row
    selected = m * min(s.index_topk, step.context + step.new_tokens) * 4
    nbytes = cached + m * row + m * nh * d * ACT + 2 * 4 * keys + selected
    flops = L * keys * (2 * nh * d + 2 * nh)
    # one launch, as the latent attention beside it counts (its launch overheads then compare alike)
    ops.append(Op("indexer", "attention", flops, L * nbytes, step.new_tokens, layers=L))
    return ops
