"""Two-batch overlap, stage by stage: how long a step takes when two micro-batches take turns on
the compute stream while each one's communication travels.

Each engine splits a layer of one micro-batch into stages and runs the two micro-batches' stages
in turn, so a transfer is hidden only by the compute that runs between its send and the wait
for it; whatever it needs beyond that stalls the stream. SGLang's plans for DeepSeek with DeepEP
(sgl-project/sglang python/sglang/srt/operations_strategy.py at 02ed4a5,
`_compute_moe_deepseek_blog_decode` and `_prefill`, after DeepSeek's profile-data design): in a
decode a micro-batch's dispatch hides behind its own shared experts and the other micro-batch's
first attention stage (the projections), its combine behind the other's second (the attention
kernel, o_proj and the router). tacit's own (worker/paths/two_batch_overlap.py): a micro-batch
runs to its next partial sum and waits for it before its next part.

Pricing the overlap as the longer of a step's total compute and total communication assumed any
compute could hide any transfer: DeepSeek-V3 on 72 H100s (256 sequences a GPU, 2,000 cached)
priced at 54.5 ms a step, 105 ms of operators folded into the longer of ~51 ms of compute and
~54 ms of transfers, where by the stages each combine (0.30 ms a layer a micro-batch) has only
0.20 ms of the other micro-batch's attention to hide behind: 71.9 ms (LMSYS measured 92).

The wire is one resource: a transfer starts when it is sent and the one before it (either
micro-batch's) is through. DeepEP's low-latency kernels leave the SMs while their RDMA is in
flight (profile-data's README), so a decode's compute is not slowed by them. Its normal kernels
(a prefill's) hold SMs of their own, 20 by default (deep_ep.Buffer.num_sms, DeepEP at 04b06f7),
and SGLang's overlapped prefill runs DeepGEMM on the rest throughout (its prefill strategy sets
deep_gemm_num_sms to the GPU's SMs less DeepEP's): the experts' grouped GEMM, compute-bound in a
prefill, at 112 of an H100's 132 SMs, 1.18x its time (deepgemm_sm_share). SGLang's dense fp8
GEMMs ran on DeepGEMM only when asked (SGL_ENABLE_JIT_DEEPGEMM, the LMSYS post of May 2025), so
they keep every SM here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from tacit.perf_model.roofline import OpTime
from tacit.platforms.specs import HardwareSpec

DEEPEP_NORMAL_SMS = 20  # deep_ep.Buffer.num_sms: the SMs DeepEP's normal (high-throughput) kernels run on

# A stage: (kind, segment) events in order. "compute" runs the segment's operators; "send" starts
# the segment's transfer; "wait" blocks until the micro-batch's oldest transfer in flight is done.
Stage = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class OverlapPlan:
    stages: tuple[Stage, ...]  # one layer of one micro-batch
    delta: int  # stages micro-batch A runs before B starts (tbo_delta_stages)


# _compute_moe_deepseek_blog_decode: attention in two stages so that each transfer has one to hide behind
DECODE_PLAN = OverlapPlan(
    stages=(
        (("compute", "attn_0"),),
        (("compute", "attn_1"), ("compute", "gate")),
        (("send", "dispatch"), ("compute", "shared")),
        (("wait", ""), ("compute", "experts"), ("send", "combine")),
        (("wait", ""),),
    ),
    delta=2,
)
# _compute_moe_deepseek_blog_prefill
PREFILL_PLAN = OverlapPlan(
    stages=(
        (("compute", "attn_0"), ("compute", "attn_1"), ("compute", "gate"), ("send", "dispatch")),
        (("wait", ""), ("compute", "experts"), ("send", "combine")),
        (("compute", "shared"), ("wait", "")),
    ),
    delta=0,
)
# tacit's own overlap (worker/paths/two_batch_overlap.py, and a tensor-parallel layout's in
# general): a micro-batch runs to its next partial sum, sends it, and waits for it before its
# next part; the two take turns, so each all-reduce hides behind the other micro-batch's part
TENSOR_PARALLEL_PLAN = OverlapPlan(
    stages=(
        (("wait", ""), ("compute", "attention"), ("send", "attention_sum")),
        (("wait", ""), ("compute", "mlp"), ("send", "mlp_sum")),
    ),
    delta=0,
)


def overlapped_layers_seconds(
    plan: OverlapPlan, segments: dict[str, float] | tuple[dict[str, float], dict[str, float]], layers: int
) -> float:
    """Seconds for both micro-batches to pass `layers` layers under `plan`, `segments` the seconds
    of one layer of a micro-batch per segment (its transfers' too), one dict for both or one
    each. Micro-batch A runs plan.delta stages alone, then A and B alternate a stage each; a wait
    with nothing in flight is free, and the step ends when both micro-batches' last transfers
    are in."""
    per_mb_segments = (segments, segments) if isinstance(segments, dict) else segments
    per_mb = [stage for _ in range(layers) for stage in plan.stages]
    order = []
    for i in range(len(per_mb) + plan.delta):
        if i < len(per_mb):
            order.append((0, i))
        if 0 <= i - plan.delta < len(per_mb):
            order.append((1, i - plan.delta))
    clock = wire_free = 0.0
    in_flight: list[deque[float]] = [deque(), deque()]
    for mb, i in order:
        seconds = per_mb_segments[mb]
        for kind, segment in per_mb[i]:
            if kind == "compute":
                clock += seconds.get(segment, 0.0)
            elif kind == "send":
                start = max(clock, wire_free)
                wire_free = start + seconds.get(segment, 0.0)
                in_flight[mb].append(wire_free)
            elif in_flight[mb]:
                clock = max(clock, in_flight[mb].popleft())
    return max([clock, *in_flight[0], *in_flight[1]])


# collectives a step makes once, not per layer: outside the layers' stages
_PER_STEP = frozenset({"logits_all_gather", "head_all_gather", "pp_send"})


def tensor_parallel_segments(times: list[tuple[str, str, float]], num_layers: int) -> tuple[dict[str, float], float]:
    """(one layer's seconds per TENSOR_PARALLEL_PLAN segment, the seconds outside the layers) for
    one micro-batch: its attention side, its MLP or MoE side (the layer's norms half with each),
    and its per-layer collectives split between the layer's two partial sums; the head, the
    sampler and the per-step collectives run outside. A MoE model's dense and MoE layers are
    averaged into one."""
    segments: dict[str, float] = {}
    outside = 0.0
    for name, op_class, seconds in times:
        if op_class in ("lm_head", "sampling") or name in _PER_STEP:
            outside += seconds
            continue
        if op_class == "communication":
            parts: tuple[str, ...] = ("attention_sum", "mlp_sum")
        elif op_class == "norm_elementwise":
            parts = ("attention", "mlp")
        else:
            parts = ("attention",) if op_class in ("attn_proj", "attention") else ("mlp",)
        for part in parts:
            segments[part] = segments.get(part, 0.0) + seconds / num_layers / len(parts)
    return segments, outside


# The operators of a MoE layer by the stage segment they run in (SGLang's op_decode_attn_0 is the
# attention's preparation: its input projections and MLA's query absorption; op_decode_attn_1 the
# attention kernel, the output absorption and o_proj). The layer's norms run half with each.
_SEGMENT = {
    "o_proj": "attn_1",
    "router": "gate",
    "shared_gate_up": "shared",
    "shared_down": "shared",
    "experts": "experts",
    "dispatch_combine": "experts",
    "moe_dispatch": "dispatch",
    "moe_combine": "combine",
}
_SPLIT = {"kv_b_absorbed": ("attn_0", "attn_1"), "norms_residual_act": ("attn_0", "attn_1")}


def segment_of(name: str, op_class: str) -> str:
    """The segment an operator of a MoE layer runs in; "" where it is not one of the layer's
    overlapped stages (dense MLPs, the head, the sampler, the attention group's collectives)."""
    if name in _SEGMENT:
        return _SEGMENT[name]
    if op_class == "attention":
        return "attn_1"
    if op_class == "attn_proj":
        return "attn_0"
    return ""


def layer_segments(
    times: list[tuple[str, str, float]], num_layers: int, moe_layers: int
) -> tuple[dict[str, float], float]:
    """(one MoE layer's seconds per segment, the seconds outside the MoE layers' stages) for one
    micro-batch, from its step operators (name, class, seconds). The attention-side operators run
    on every layer: a MoE layer's share is 1/num_layers of them, the dense layers' rest is
    outside; the MoE operators count over the MoE layers alone."""
    segments: dict[str, float] = {}
    outside = 0.0
    for name, op_class, seconds in times:
        segment = segment_of(name, op_class)
        parts = _SPLIT.get(name) or ((segment,) if segment else ())
        if not parts:
            outside += seconds
            continue
        moe_only = op_class in ("experts", "moe_routing", "communication")
        per_layer = seconds / (moe_layers if moe_only else num_layers)
        if not moe_only:
            outside += seconds - per_layer * moe_layers
        for part in parts:
            segments[part] = segments.get(part, 0.0) + per_layer / len(parts)
    return segments, outside


def two_batch_seconds(
    halves: tuple[list[OpTime], list[OpTime]], num_layers: int, moe_layers: int, decode: bool
) -> float:
    """Seconds of a step run as two micro-batches, from each one's operators' times: with DeepEP's
    dispatch among them SGLang's stage plans over the MoE layers, the rest of the step serially;
    otherwise tacit's turn-taking over every layer's partial sums. The step's fixed cost is the
    caller's."""
    named = [[(t.op.name, t.op.op_class, t.seconds) for t in h] for h in halves]
    if any(name == "moe_dispatch" for name, _, _ in named[0]):
        plan, layers = (DECODE_PLAN if decode else PREFILL_PLAN), moe_layers
        split = [layer_segments(h, num_layers, moe_layers) for h in named]
    else:
        plan, layers = TENSOR_PARALLEL_PLAN, num_layers
        split = [tensor_parallel_segments(h, num_layers) for h in named]
    inside = overlapped_layers_seconds(plan, (split[0][0], split[1][0]), layers)
    return inside + split[0][1] + split[1][1]


def deepgemm_sm_share(times: list[OpTime], spec: HardwareSpec, decode: bool) -> list[OpTime]:
    """A micro-batch's operators as SGLang's overlapped prefill runs them with DeepEP's normal
    kernels: the experts' grouped GEMM (DeepGEMM) on the SMs DeepEP leaves, its compute time
    stretched by sms / (sms - 20) where compute binds it. Unchanged for a decode (its low-latency
    kernels hold no SMs in flight), for a part that states no SM count, or without DeepEP."""
    normal = any(t.op.name == "moe_dispatch" and t.op.algorithm == "normal" for t in times)
    if decode or not normal or spec.sms is None:
        return times
    share = (spec.sms.value - DEEPEP_NORMAL_SMS) / spec.sms.value
    out = []
    for t in times:
        if t.op.name == "experts":
            compute = t.compute_s / share
            t = replace(
                t, seconds=t.seconds - max(t.compute_s, t.memory_s) + max(compute, t.memory_s), compute_s=compute
            )
        out.append(t)
    return out
