"""FLOPs and bytes of one engine step, per operator class, on one device.

A step is `batch` sequences, each adding `new_tokens` to `context` tokens already cached
(decode: new_tokens=1; a whole-prompt prefill: context=0). Counts are per device under tensor
parallelism of `tp` (heads, features and vocabulary split; MLA's latent cache whole on every
rank, as tacit keeps it) and, with `ep`, experts split whole across the same ranks; with
`dp_attention` the ranks split the sequences instead of the heads for attention (each holds
every head and 1/tp of the sequences' KV; tacit's --data-parallel-attention). Parallel's other
parts (dense-MLP TP, EP size and TP inside experts, the head's group, DeepEP dispatch, pipeline
sends) are priced where each part runs; a step's ops are those of one replica's device, summed
over every pipeline stage (a step's latency), the busiest device's where devices differ.
Weights are read once per step per device (the roofline's assumption; the fitted GEMM
efficiency absorbs a kernel that re-reads them in row chunks).
"""

from __future__ import annotations

from dataclasses import replace

from tacit.perf_model.attention_ops import attention_ops
from tacit.perf_model.dtypes import activation_bytes, gemm_compute_dtype, weight_bytes_per_value
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.moe_dispatch import busiest_pairs, deepep_ops, expert_load_factor, expert_slots
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
    step.new_tokens each (mixed steps pass the sum over their chunks). Dense MLPs run over the
    tokens of their TP group (Parallel.dense_group); under DeepEP the router and the shared
    experts run on a device's own tokens (the shared experts whole on each). act: the quantized
    linears' activation dtype."""
    h, ops = s.hidden_size, []
    dts = s.tensor_dtypes(wdt)
    expert_dt, wdt = dts.experts, dts.linear
    dense_layers = s.num_dense_layers if s.is_moe else s.num_layers
    dense_rows = par.group_sequences(step.batch, par.dense_group) * step.new_tokens
    if dense_layers:
        inter = s.intermediate_size // par.dense_group
        ops.append(gemm_op("gate_up_proj", "dense_mlp", dense_rows, h, 2 * inter, wdt, group, dense_layers, act))
        ops.append(gemm_op("down_proj", "dense_mlp", dense_rows, inter, h, wdt, group, dense_layers, act))
    if not s.is_moe or not s.num_moe_layers:
        return ops
    L, e, k = s.num_moe_layers, s.num_experts, s.top_k
    deepep = par.backend == "deepep"
    m = par.own_tokens(step) if deepep else step.tokens
    # routing: the router GEMM (kept bf16), top-k, and gathering each token's rows to its experts
    router_bytes = L * (h * e * 2 + m * (h * ACT + e * 4))
    ops.append(Op("router", "moe_routing", L * 2 * m * h * e, router_bytes, m, launches=L, is_gemm=True))
    if draws is None:
        draws = step.batch * s.sequence_draws(step.new_tokens)
    pairs = busiest_pairs(s, step, par, draws)
    # each row this device computes gathered to its expert and scattered back, per layer: every
    # token's k rows under TP experts, only its own experts' rows under EP
    moved = 2 * pairs * h * ACT
    ops.append(Op("dispatch_combine", "moe_routing", L * pairs * h * 2, L * moved, m, launches=L, working_set=moved))
    if par.ep:  # the busiest rank holds ceil((E + R) / EP) whole experts, 1/expert_tp of their width
        local_experts, inter = expert_slots(s, par)[0], s.moe_intermediate_size / par.expert_tp
    else:  # each rank holds every expert's 1/N of the features
        local_experts, inter = e, s.moe_intermediate_size / par.stage_devices
    distinct = expected_distinct_experts(e, k, draws) * min(local_experts, e) / e
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
    # Two kernels a layer, whatever the experts hit: every engine priced runs all of a layer's
    # experts as one grouped GEMM for gate_up and one for down (vLLM's and SGLang's fused_moe,
    # DeepGEMM's grouped GEMM, npu_grouped_matmul, sgl-kernel's and tacit's C++ fused experts,
    # ggml's mul_mat_id). Charging a launch per distinct expert priced DeepSeek-R1's TP8 decode on
    # an H200 at 8 sequences 11 ms over its 4.3 ms of weight reads (58 layers x ~56 experts x
    # 3.4 us): 21.5 ms a token where InferenceX measured 12.8.
    ops.append(
        Op(
            "experts",
            "experts",
            L * flops,
            L * (distinct * per_expert + acts),
            rows,
            expert_dt,
            2 * L,
            is_gemm=True,
            kernel="moe",
            act_dtype=gemm_compute_dtype(expert_dt, act),
        )
    )
    if s.num_shared_experts:
        split = 1 if deepep else par.dense_group
        shared_rows = m if deepep else dense_rows
        shared = s.num_shared_experts * s.moe_intermediate_size // split
        # the shared expert runs in the same C++ experts call (cpu_fused_moe)
        ops.append(
            replace(
                gemm_op("shared_gate_up", "experts", shared_rows, h, 2 * shared, expert_dt, group, L, act), kernel="moe"
            )
        )
        ops.append(
            replace(gemm_op("shared_down", "experts", shared_rows, shared, h, expert_dt, group, L, act), kernel="moe")
        )
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
    (~3 passes of the hidden state). A few FLOPs per element; bytes are what count. Under
    DeepEP a device norms its own tokens and activates the expert rows it computes (the busiest
    device's pairs); otherwise every token of the stage, as tacit's engine gathers them."""
    m, h, L = step.tokens, s.hidden_size, s.num_layers
    width = s.moe_intermediate_size * s.top_k if s.is_moe else s.intermediate_size / par.tp
    heads = (s.num_heads + s.num_kv_heads) / par.tp * (s.qk_rope_head_dim or s.head_dim)
    if s.is_moe and par.backend == "deepep":
        m = par.own_tokens(step)
        pairs = busiest_pairs(s, step, par, step.batch * s.sequence_draws(step.new_tokens))
        width = pairs * s.moe_intermediate_size / par.expert_tp / max(m, 1e-9)
        heads = (s.num_heads + s.num_kv_heads) * (s.qk_rope_head_dim or s.head_dim)
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
    vocab-parallel over Parallel.head_group and over the sampled rows of the attention groups it
    spans; the sampler over the full vocabulary of each sampled row (the logits are all-gathered
    first): every row of the stage as tacit's engine samples, a device's own group's rows under
    DeepEP or --enable-dp-lm-head."""
    g = par.head_group
    v = s.vocab_size / g
    rows_g = par.group_sequences(sampled_rows, g)
    head = gemm_op("lm_head", "lm_head", rows_g, s.hidden_size, v, s.tensor_dtypes(wdt).head, 32, 1, act)
    vocab = s.vocab_size
    rows = sampled_rows
    if par.dp_lm_head or (s.is_moe and par.backend == "deepep"):
        rows = par.sequences_per_device(sampled_rows)
    sample = Op("sampler", "sampling", 5 * rows * vocab, sampler_bytes(rows, vocab), rows)
    return [head, sample]


def _collective(
    ops: dict[str, Op], name: str, kind: str, count: float, nbytes: float, ranks: int, alg: str = ""
) -> None:
    """`count` calls of `nbytes` each among `ranks`, merged into the op of that name."""
    if ranks <= 1 or count <= 0:
        return
    op = Op(
        name, "communication", 0, count * nbytes, launches=count, collective=kind, participants=ranks, algorithm=alg
    )
    prev = ops.get(name)
    if prev is not None and (prev.participants != ranks or prev.collective != kind):
        name = f"{name}_{ranks}"  # another group size: its own row
        op, prev = replace(op, name=name), ops.get(name)
    if prev is not None:
        op = replace(prev, bytes=prev.bytes + op.bytes, launches=prev.launches + count)
    ops[name] = op


def communication_ops(s: ModelShape, step: StepShape, par: Parallel, sampled_rows: int, reduce_bytes: int) -> list[Op]:
    """Per device, per part (`reduce_bytes` per summed value: tacit's CPU ranks sum in float32):
    - attention TP: an all-reduce of the group's hidden states after attention, every layer;
    - a dense MLP over the attention group's devices (or fewer) all-reduces; over more (dense TP
      spanning attention groups) it all-gathers their tokens and reduce-scatters the sums;
    - MoE layers, tacit's engine (allgather): as a dense MLP over every device of the stage,
      or with EP inside one attention group an all-to-all of each token's row to its k experts
      and back; DeepEP: attention's sums reduce-scattered inside the attention group, dispatch /
      combine of the device's own tokens (moe_dispatch.py), then all-gathered back;
    - the embedding reduce-scatters its rows when vocab-parallel over several attention groups;
    - the head: the logits all-gathered over its group; over several attention groups the
      sampled rows' hidden states are gathered first;
    - pipeline stages: P-1 sends of the hidden states (across nodes when a stage fills one)."""
    if par.stage_devices == 1 and par.pp == 1:
        return []
    h, L, nt, alg = s.hidden_size, s.num_layers, step.new_tokens, par.all_reduce_algorithm
    group_rows = par.sequences_per_device(step.batch) * nt  # an attention group's tokens
    ops: dict[str, Op] = {}
    na, S = par.attention_tp, par.stage_devices
    moe, deepep = s.num_moe_layers, s.is_moe and par.backend == "deepep"
    # DeepEP: before a MoE layer attention's sums are reduce-scattered, each device keeping the
    # tokens it dispatches (all-gathered back after the combine), the all-reduce's bytes in halves
    _collective(ops, "all_reduce", "all_reduce", L - moe if deepep else L, group_rows * h * reduce_bytes, na, alg)
    if deepep:
        _collective(ops, "attn_reduce_scatter", "reduce_scatter", moe, group_rows * h * reduce_bytes, na)

    def mlp(layers: int, group: int) -> None:
        """`layers` MLPs whose weights split over `group` devices."""
        if group <= na:
            name = "all_reduce" if group == na else "mlp_all_reduce"
            _collective(ops, name, "all_reduce", layers, group_rows * h * reduce_bytes, group, alg)
            return
        rows = par.group_sequences(step.batch, group) * nt
        _collective(ops, "mlp_all_gather", "all_gather", layers, rows * h * ACT, group)
        _collective(ops, "mlp_reduce_scatter", "reduce_scatter", layers, rows * h * reduce_bytes, group)

    mlp(s.num_dense_layers if s.is_moe else L, par.dense_group)
    extra: list[Op] = []
    if moe and deepep:
        draws = step.batch * s.sequence_draws(nt)
        extra = deepep_ops(s, step, par, expert_load_factor(s, par, draws))
        _collective(ops, "moe_all_gather", "all_gather", moe, group_rows * h * ACT, na)
    elif moe and par.ep and par.attention_ranks == 1:
        # Every rank holds every token (attention TP): it runs its own experts on the tokens routed
        # to them and the layer's output is all-reduced, as tacit's engine does (layers/moe.py's
        # expert_slots: another rank's experts are skipped) and vLLM's TP+EP: no all-to-all.
        _collective(ops, "moe_all_reduce", "all_reduce", moe, group_rows * h * reduce_bytes, par.expert_ranks, alg)
    elif moe:
        mlp(moe, S)
    g = par.head_group
    rows = par.group_sequences(sampled_rows, g)
    if g > na:
        embed = par.group_sequences(step.batch, g) * nt * h * reduce_bytes
        _collective(ops, "mlp_reduce_scatter", "reduce_scatter", 1, embed, g)
        _collective(ops, "head_all_gather", "all_gather", 2, rows * (h * ACT + s.vocab_size * 4) / 2, g)
    else:
        _collective(ops, "logits_all_gather", "all_gather", 1, rows * s.vocab_size * 4, g)
    if par.pp > 1:
        # consecutive stages sit on the next devices: a stage of a node's devices or more sends across nodes
        send, k = group_rows * h * ACT, par.devices_per_node
        crossing = sum(1 for i in range(1, par.pp) if k and (i * S) // k != (i * S - 1) // k)
        extra.append(
            Op(
                "pp_send",
                "communication",
                0,
                (par.pp - 1) * send,
                launches=par.pp - 1,
                collective="p2p",
                participants=2,
                inter_bytes=crossing * send,
            )
        )
    return [*ops.values(), *extra]


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
