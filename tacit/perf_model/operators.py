"""FLOPs and bytes of one engine step, per operator class, on one device.

A step is `batch` sequences, each adding `new_tokens` to `context` tokens already cached
(decode: new_tokens=1; a whole-prompt prefill: context=0). Counts are per device under tensor
parallelism of `tp` (heads, features and vocabulary split; MLA's latent cache whole on every
rank, as tacit keeps it) and, with `ep`, experts split whole across the same ranks; with
`dp_attention` the ranks split the sequences instead of the heads for attention (each holds
every head and 1/tp of the sequences' KV; tacit's --data-parallel-attention).
Weights are read once per step per device (the roofline's assumption; the fitted GEMM
efficiency absorbs a kernel that re-reads them in row chunks).
"""

from __future__ import annotations

from dataclasses import replace

from tacit.perf_model.attention_ops import attention_ops
from tacit.perf_model.dtypes import activation_bytes, gemm_compute_dtype, weight_bytes_per_value
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.op_types import ACT, OP_CLASSES, Op, Parallel, StepShape, gemm_op

SINGLE_DEVICE = Parallel()  # step_ops' default layout: no parallelism

# The operator model's names, op_types.py's and attention_ops.py's re-exported from where callers
# have always imported them.
__all__ = [
    "ACT",
    "OP_CLASSES",
    "SINGLE_DEVICE",
    "Op",
    "Parallel",
    "StepShape",
    "attention_ops",
    "communication_ops",
    "elementwise_ops",
    "expected_distinct_experts",
    "head_ops",
    "layer_elementwise_bytes",
    "mlp_ops",
    "sampler_bytes",
    "step_ops",
]


def expected_distinct_experts(experts: int, top_k: int, draws: float) -> float:
    """Experts a step reads when `draws` tokens each pick top_k of `experts` uniformly:
    E * (1 - (1 - k/E)^B). One token reads k; many tokens read all E. A step's draws are its
    sequences' ModelShape.sequence_draws (its tokens, when every token routes independently)."""
    return experts * (1 - (1 - top_k / experts) ** draws)


def mlp_ops(
    s: ModelShape, step: StepShape, par: Parallel, wdt: str, group: int, draws: float | None = None, act: str = "auto"
) -> list[Op]:
    """draws: the step's independent routing draws; default step.batch sequences of
    step.new_tokens each (mixed steps pass the sum over their chunks). act: the quantized
    linears' activation dtype."""
    m, h, ops = step.tokens, s.hidden_size, []
    dts = s.tensor_dtypes(wdt)
    expert_dt, wdt = dts.experts, dts.linear
    dense_layers = s.num_dense_layers if s.is_moe else s.num_layers
    if dense_layers:
        inter = s.intermediate_size // par.tp
        ops.append(gemm_op("gate_up_proj", "dense_mlp", m, h, 2 * inter, wdt, group, dense_layers, act))
        ops.append(gemm_op("down_proj", "dense_mlp", m, inter, h, wdt, group, dense_layers, act))
    if not s.is_moe or not s.num_moe_layers:
        return ops
    L, e, k = s.num_moe_layers, s.num_experts, s.top_k
    # routing: the router GEMM (kept bf16), top-k, and gathering each token's rows to its experts
    router_bytes = L * (h * e * 2 + m * (h * ACT + e * 4))
    ops.append(Op("router", "moe_routing", L * 2 * m * h * e, router_bytes, m, launches=L, is_gemm=True))
    moved = 2 * m * k * h * ACT  # each token's row to its k experts and back, per layer
    ops.append(Op("dispatch_combine", "moe_routing", L * m * k * h * 2, L * moved, m, launches=L, working_set=moved))
    if par.ep:  # each rank holds E/N whole experts and computes the pairs routed to them
        local_experts, inter, pairs = e / par.tp, s.moe_intermediate_size, m * k / par.tp
    else:  # each rank holds every expert's 1/N of the features
        local_experts, inter, pairs = e, s.moe_intermediate_size / par.tp, m * k
    if draws is None:
        draws = step.batch * s.sequence_draws(step.new_tokens)
    distinct = expected_distinct_experts(e, k, draws) * local_experts / e
    # gate and up in the default type, down in a GGML mix's ffn_down type (Q6_K on some layers)
    gate_up = weight_bytes_per_value(expert_dt, group, "", L)
    down = weight_bytes_per_value(expert_dt, group, "ffn_down", L)
    per_expert = h * inter * (2 * gate_up + down)
    flops = 2 * pairs * 3 * h * inter
    # per pair: the hidden row in and the down projection's input (at the activation dtype where
    # the kernel reads them quantized), the gate and up outputs and the hidden row out (bf16)
    act_in = activation_bytes(expert_dt, act)
    acts = pairs * ((h + inter) * act_in + (h + 2 * inter) * ACT)
    rows = pairs / max(distinct, 1e-9)  # tokens per expert weight pass
    ops.append(
        Op(
            "experts",
            "experts",
            L * flops,
            L * (distinct * per_expert + acts),
            rows,
            expert_dt,
            L * distinct,
            is_gemm=True,
            kernel="moe",
            act_dtype=gemm_compute_dtype(expert_dt, act),
        )
    )
    if s.num_shared_experts:
        shared = s.num_shared_experts * s.moe_intermediate_size // par.tp
        # the shared expert runs in the same C++ experts call (cpu_fused_moe)
        ops.append(
            replace(gemm_op("shared_gate_up", "experts", m, h, 2 * shared, expert_dt, group, L, act), kernel="moe")
        )
        ops.append(replace(gemm_op("shared_down", "experts", m, shared, h, expert_dt, group, L, act), kernel="moe"))
    return ops


def layer_elementwise_bytes(rows: float, hidden: float, width: float, rope_width: float, qk_norm: bool) -> float:
    """One layer's elementwise traffic over `rows` tokens, counted as the minimum each op must move
    (fit.py's micro-benchmark runs exactly these ops and divides this count by its time, so the
    fitted efficiency absorbs the extra passes of tacit's real code, e.g. RMSNorm's float32 copy):
    2 RMSNorms (read x, write y: 2 passes of hidden), 2 residual adds (3 passes), SiLU(gate) * up
    (read 2, write 1 over the MLP width), RoPE on q and k (read + write over rope_width values) and,
    Qwen3, an RMSNorm per head on q and k (another 2 passes over them)."""
    return rows * (2 * 2 * hidden + 2 * 3 * hidden + 3 * width + 2 * rope_width * (2 if qk_norm else 1)) * ACT


def elementwise_ops(s: ModelShape, step: StepShape, par: Parallel) -> list[Op]:
    """Per layer: layer_elementwise_bytes; plus the embedding lookup and the final norm
    (~3 passes of the hidden state). A few FLOPs per element; bytes are what count."""
    m, h, L = step.tokens, s.hidden_size, s.num_layers
    width = s.moe_intermediate_size * s.top_k if s.is_moe else s.intermediate_size / par.tp
    heads = (s.num_heads + s.num_kv_heads) / par.tp * (s.qk_rope_head_dim or s.head_dim)
    per_layer = layer_elementwise_bytes(m, h, width, heads, s.qk_norm)
    flops = L * m * (4 * 5 * h + 4 * width + 6 * heads)
    nbytes = L * per_layer + 3 * m * h * ACT
    return [Op("norms_residual_act", "norm_elementwise", flops, nbytes, m, launches=6 * L, working_set=per_layer)]


def sampler_bytes(rows: float, vocab: float) -> float:
    """Greedy sampling (tacit's Sampler): the bf16 logits read and cast to float32 (2 + 4 bytes
    per entry), the float32 row read again by argmax (4): 10 bytes per vocabulary entry. fit.py's
    sampler micro-benchmark divides this same count by its time."""
    return rows * vocab * (ACT + 4 + 4)


def head_ops(
    s: ModelShape, step: StepShape, par: Parallel, sampled_rows: int, wdt: str = "bf16", act: str = "auto"
) -> list[Op]:
    """lm_head over the rows that sample, in the checkpoint's head dtype under --quantization `wdt`
    (dtypes.tensor_dtypes: bf16 unless the checkpoint stores it quantized, a GGML file's Q6_K),
    and the sampler over the full vocabulary of each sampled row (the logits are all-gathered
    first)."""
    v = s.vocab_size / par.tp
    head = gemm_op("lm_head", "lm_head", sampled_rows, s.hidden_size, v, s.tensor_dtypes(wdt).head, 32, 1, act)
    vocab = s.vocab_size
    sample = Op("sampler", "sampling", 5 * sampled_rows * vocab, sampler_bytes(sampled_rows, vocab), sampled_rows)
    return [head, sample]


def communication_ops(s: ModelShape, step: StepShape, par: Parallel, sampled_rows: int, reduce_bytes: int) -> list[Op]:
    """Tensor parallel: an all-reduce of the hidden state after attention and after the MLP in
    every layer (`reduce_bytes` per value: tacit's CPU ranks sum in float32) and an all-gather of
    the logits. Expert parallel: the MoE layer's all-reduce becomes an all-to-all dispatch of each
    token's hidden state to its k experts' ranks and the combine back. Data-parallel attention:
    no attention all-reduce; every layer's MLP all-gathers the ranks' tokens and reduce-scatters
    the sums back (tacit's layers/data_parallel.py), the embedding reduce-scatters its rows, and
    the sampled rows' hidden states are gathered before the head."""
    n = par.tp
    if n == 1:
        return []
    m, h, L = step.tokens, s.hidden_size, s.num_layers
    if par.dp_attention:
        return [
            Op(
                "mlp_all_gather",
                "communication",
                0,
                L * m * h * ACT,
                launches=L,
                collective="all_gather",
                participants=n,
            ),
            Op(
                "mlp_reduce_scatter",
                "communication",
                0,
                (L + 1) * m * h * reduce_bytes,
                launches=L + 1,
                collective="reduce_scatter",
                participants=n,
            ),
            Op(
                "head_all_gather",
                "communication",
                0,
                sampled_rows * (h * ACT + s.vocab_size * 4),
                launches=2,
                collective="all_gather",
                participants=n,
            ),
        ]
    message = m * h * reduce_bytes
    moe_layers = s.num_moe_layers if par.ep else 0
    ops = [
        Op(
            "all_reduce",
            "communication",
            0,
            (2 * L - moe_layers) * message,
            launches=2 * L - moe_layers,
            collective="all_reduce",
            participants=n,
        ),
        Op(
            "logits_all_gather",
            "communication",
            0,
            sampled_rows * s.vocab_size * 4,
            collective="all_gather",
            participants=n,
        ),
    ]
    if moe_layers:
        a2a = 2 * m * s.top_k * h * ACT  # dispatch + combine, each token to k experts
        ops.append(
            Op(
                "moe_all_to_all",
                "communication",
                0,
                moe_layers * a2a,
                launches=2 * moe_layers,
                collective="all_to_all",
                participants=n,
            )
        )
    return ops


def step_ops(
    s: ModelShape,
    step: StepShape,
    par: Parallel = SINGLE_DEVICE,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    group_size: int = 32,
    reduce_bytes: int = 2,
    act: str = "auto",
) -> list[Op]:
    """Every operator of one step on one device; `act`: the quantized linears' activation dtype."""
    if par.tp < 1:
        raise ValueError(f"tensor parallel size must be >= 1, got {par.tp}")
    sampled = step.batch  # one sampled row per sequence, prefill or decode
    return [
        *attention_ops(s, step, par, weight_dtype, kv_dtype, group_size, act),
        *mlp_ops(s, step, par, weight_dtype, group_size, act=act),
        *elementwise_ops(s, step, par),
        *head_ops(s, step, par, sampled, weight_dtype, act),
        *communication_ops(s, step, par, sampled, reduce_bytes),
    ]
