"""Time of each operator on a HardwareSpec: max(FLOPs / (peak * eff), bytes / (bw * eff)) + its
launches' overhead; and which roof binds it."""

from __future__ import annotations

from dataclasses import dataclass

from tacit.perf_model.dtypes import gemm_compute_dtype
from tacit.perf_model.efficiency import Profile
from tacit.perf_model.operators import Op
from tacit.perf_model.parallel import Link, collective_seconds, direct_send_seconds
from tacit.platforms.specs import HardwareSpec


@dataclass(frozen=True)
class OpTime:
    op: Op
    seconds: float
    compute_s: float  # at the fitted efficiency
    memory_s: float
    peak_flops: float

    @property
    def bound(self) -> str:
        if self.op.op_class == "communication":
            return "link-bound"
        return "compute-bound" if self.compute_s >= self.memory_s else "memory-bound"


def _efficiency(op: Op, profile: Profile, decode: bool, path: str) -> float:
    if op.is_gemm:
        fused = f"{op.weight_dtype}_fused_decode"
        if path == "decode_fused" and not op.kernel and op.op_class != "experts" and fused in profile.gemm:
            return profile.gemm[fused](op.rows)  # fitted in whole decode steps (fit_decode.py)
        if op.kernel == "moe":  # the experts kernel's own curve where fitted (bf16), else the dtype's
            key = f"moe_{op.weight_dtype}"
            return (
                profile.gemm[key](op.rows) if key in profile.gemm else profile.gemm_efficiency(op.weight_dtype, op.rows)
            )
        return profile.gemm_efficiency(op.kernel or op.weight_dtype, op.rows)
    if op.op_class == "attention":
        torch_gqa = op.gqa_group and path.startswith("torch") and profile.attention_decode_torch is not None
        if decode and torch_gqa:
            return profile.attention_decode_torch(op.gqa_group)
        if decode:
            return profile.attention_decode
        return (profile.attention_prefill_mla if op.kernel == "mla" else profile.attention_prefill)(op.rows)
    if op.op_class == "sampling":
        return profile.sampling(op.rows)
    return profile.elementwise(op.working_set)


def launch_seconds(profile: Profile, graphs: bool) -> float:
    """One kernel launch: replayed from a captured graph, or launched eagerly (a profile without
    graph figures prices every launch eagerly)."""
    if graphs and profile.graph_op_overhead_s is not None:
        return profile.graph_op_overhead_s
    return profile.op_overhead_s


def op_time(
    op: Op, spec: HardwareSpec, profile: Profile, decode: bool, path: str = "torch", graphs: bool = False
) -> OpTime:
    """`path`: the engine path the step runs ("decode_fused" or "torch"), which picks the curve;
    `graphs`: the step is a captured graph's replay (spec.graphs, decode, no --enforce-eager)."""
    if op.op_class == "communication":
        t = communication_seconds(op, spec)
        return OpTime(op, t, 0.0, t, 0.0)
    compute_dtype = gemm_compute_dtype(op.weight_dtype, op.act_dtype) if op.is_gemm else "bf16"
    peak = spec.peak_flops(compute_dtype)
    eff = _efficiency(op, profile, decode, path)
    experts = op.name == "experts"  # the routed experts; the shared expert is a dense GEMM
    compute_eff = profile.compute_fraction(op.weight_dtype, compute_dtype, experts) if op.is_gemm else None
    compute = op.flops / (peak * (compute_eff or eff))
    memory = op.bytes / (spec.memory_bandwidth.value * eff)
    return OpTime(op, max(compute, memory) + op.launches * launch_seconds(profile, graphs), compute, memory, peak)


def links(spec: HardwareSpec) -> tuple[Link, Link]:
    """(inside a node, between nodes): the network's figures where the part has them, else its
    own links' (a part listed without a network is priced as if its links reached every peer)."""
    intra = Link(spec.link_bandwidth.value, spec.link_latency.value)
    bw, lat = spec.inter_node_bandwidth, spec.inter_node_latency
    return intra, Link(bw.value if bw else intra.bandwidth, lat.value if lat else intra.latency)


def communication_seconds(op: Op, spec: HardwareSpec) -> float:
    """A communication op's launches, each one call of its per-call bytes (parallel.py): a
    collective over its participants, or (all_to_all_v: DeepEP's dispatch / combine; p2p: a
    pipeline send) messages sent at once, `inter_bytes` of them across nodes. DeepEP's
    low-latency kernels pay one latency a call; its normal ones two (the layout notify, then
    the transfer)."""
    calls = max(op.launches, 1)
    intra, inter = links(spec)
    if op.collective in ("all_to_all_v", "p2p"):
        steps = 2 if op.algorithm == "normal" else 1
        return calls * direct_send_seconds(op.bytes / calls, op.inter_bytes / calls, steps, intra, inter)
    per_node = spec.devices_per_node
    return calls * collective_seconds(
        op.collective, op.bytes / calls, op.participants, intra, inter, per_node, op.algorithm
    )


def step_seconds(
    times: list[OpTime], profile: Profile, path: str, num_layers: int, graphs: bool = False, rows: int = 1
) -> float:
    """The step: its operators in sequence, plus the engine's fixed cost per step and per layer
    on the path it runs (fitted on this CPU; from published launch costs elsewhere), and on a
    path with a per-row fit, its `rows` sequences' host cost. A graph replay has no per-layer
    host cost but one graph launch. path "prefill" is a step with prompt tokens
    (fit_prefill.py); a profile without that fit charges it the torch path's."""
    fallback = "torch" if path == "prefill" else path
    fixed = profile.step_overhead_s.get(path, profile.step_overhead_s.get(fallback, 0.0))
    if graphs and profile.graph_op_overhead_s is not None:
        fixed += profile.graph_step_overhead_s
    else:
        fixed += num_layers * profile.layer_overhead_s.get(path, profile.layer_overhead_s.get(fallback, 0.0))
        per_row = profile.row_overhead_s.get(path, 0.0) + num_layers * profile.row_layer_overhead_s.get(path, 0.0)
        fixed += max(rows - 1, 0) * per_row
    return sum(t.seconds for t in times) + fixed


def bottlenecks(times: list[OpTime], spec: HardwareSpec, phase: str) -> dict[str, str]:
    """Per operator class: which roof binds it, its arithmetic intensity against the ridge
    point (peak FLOP/s / bandwidth), and its share of the phase's operator time."""
    total = sum(t.seconds for t in times) or 1.0
    out: dict[str, str] = {}
    for cls in dict.fromkeys(t.op.op_class for t in times):
        group = [t for t in times if t.op.op_class == cls]
        secs = sum(t.seconds for t in group)
        share = f"{100 * secs / total:.0f}% of the step"
        if cls == "communication":
            out[cls] = f"link-bound, {sum(t.op.bytes for t in group) / 1e6:.2f} MB per step, {share}"
            continue
        flops, nbytes = sum(t.op.flops for t in group), sum(t.op.bytes for t in group)
        peak = max(t.peak_flops for t in group)
        bound = "compute-bound" if sum(t.compute_s for t in group) >= sum(t.memory_s for t in group) else "memory-bound"
        ridge = peak / spec.memory_bandwidth.value
        out[cls] = f"{bound}, {flops / max(nbytes, 1):.1f} FLOP/byte against a ridge of {ridge:.0f}, {share}"
    return {f"{phase} {k}": v for k, v in out.items()}
