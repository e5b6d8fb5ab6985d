"""Efficiency profiles: the fraction of a roof each operator class reaches, and fixed costs.

data/efficiency.json holds one profile per family of hardware (nvidia-hopper, ascend-910,
epyc-zen4, ...), from microbenchmarks published for those processors (STREAM, vendor GEMM, launch
costs), each figure's source in the profile's `figures`, and fits made on a named part
(`python -m tacit.perf_model.fit --name NAME --out FILE`). `this-cpu` has no entry: each machine
fits its own, cached (calibration.py). A `--hardware-file` may bring its own profile:
`register_profile` adds it for the process, under a name no file profile has.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from tacit.perf_model.dtypes import efficiency_dtype
from tacit.perf_model.ggml_mixes import GGML_MIXES
from tacit.platforms.specs import HardwareSpec, Sourced

DATA = Path(__file__).resolve().parent / "data" / "efficiency.json"


@dataclass(frozen=True)
class Curve:
    """Efficiency against activation rows (GEMM, sampler) or bytes per layer (elementwise), the
    curve's x, interpolated in log(x), flat beyond its ends."""

    rows: tuple[float, ...]
    eff: tuple[float, ...]

    def __call__(self, rows: float) -> float:
        x = math.log(max(rows, self.rows[0]))
        xs = [math.log(r) for r in self.rows]
        i = bisect.bisect_right(xs, x)
        if i >= len(xs):
            return self.eff[-1]
        if i == 0:
            return self.eff[0]
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return self.eff[i - 1] + t * (self.eff[i] - self.eff[i - 1])


@dataclass(frozen=True)
class Profile:
    name: str
    gemm: dict[str, Curve]  # weight dtype -> curve; a dtype without one uses bf16's (int4: int8's)
    attention_decode: float  # fraction of bandwidth a decode attention streams the KV cache at
    # fraction of the roof a prefill attention reaches (causal count), by prompt length
    attention_prefill: Curve
    attention_prefill_mla: Curve  # the same for MLA's prefill path (fit_attention.py)
    # fraction of bandwidth the elementwise ops (norms, adds, activation, RoPE, MoE dispatch)
    # reach against their counted bytes, by bytes per layer; their fixed launch costs are in the
    # step and layer overheads
    elementwise: Curve
    sampling: Curve  # the same for the sampler over the logits, by sampled rows
    op_overhead_s: float  # per kernel launch
    # per step and per layer, by the path a step runs ("decode_fused", "torch", "torch_dense",
    # "torch_moe", "prefill"): Python, scheduling
    step_overhead_s: dict[str, float]
    layer_overhead_s: dict[str, float]
    torch_decode_architectures: tuple[str, ...]  # architectures whose decode runs the torch path
    reduce_bytes: int  # bytes per value of a tensor-parallel all-reduce
    source: str
    # the roofs (bf16_flops, read_bandwidth) the efficiencies were fitted against: a fitted
    # profile predicts with these, not with roofs re-measured in the predicting process (this
    # CPU's read bandwidth moved 41.0 -> 37.7 GB/s between two processes on the shared machine)
    roofs: dict[str, float] | None = None
    # Under graphs (CUDA / HIP / ACL graphs, HardwareSpec.graphs unless --enforce-eager) a decode
    # step replays its kernels: each costs graph_op_overhead_s instead of op_overhead_s, the step
    # one graph launch (graph_step_overhead_s), and no per-layer host cost. None: the profile has
    # no graph figures and launches are priced eagerly.
    graph_op_overhead_s: float | None = None
    graph_step_overhead_s: float = 0.0
    # the dtype the fitted machine's engine computes in ("bf16"; "fp32" for a this-cpu fit on a
    # CPU without a native bf16 matmul): its curve is the one a dtype without its own borrows
    compute_dtype: str = "bf16"
    # the torch path's GQA decode attention by query heads per KV head (a CPU without tacit's
    # C++ kernels: fit_attention.torch_decode_attention_curve); None: attention_decode for all
    attention_decode_torch: Curve | None = None
    # and its host cost, per layer, of each padded decode group past the first (the gather,
    # padding and SDPA call of one more context bucket: fit_attention.torch_decode_group_seconds)
    attention_decode_torch_group_s: float = 0.0
    # a torch-path decode step's host cost for each row past the first, and for each row past
    # the first and layer (the scheduler's and sampler's per-sequence work, the attention
    # backend's per-sequence metadata), by path: a 256-wide dense Qwen3's step at 16 rows left
    # 1.3-1.9 ms more over its operators than at 1 row, DeepSeek-V3's 2.8-6.1 (fit_torch_decode.py);
    # a path without them charges none
    row_overhead_s: dict[str, float] = field(default_factory=dict)
    row_layer_overhead_s: dict[str, float] = field(default_factory=dict)
    # The GEMMs' fraction of the part's compute peak, by the dtype they compute in, where the
    # engine's kernels reach a far smaller share of it than of bandwidth: ggml on a Xeon streams
    # weights at 0.41 of the datasheet but runs no AMX, 0.032 of the AMX int8 peak the table
    # states. The gemm curve then prices only the bytes; empty: one curve prices both roofs.
    # A GGML block type's own entry (q4_k, iq4_xs) overrides its compute dtype's where the engine
    # runs that type through a slower kernel: mainline llama.cpp's tinyBLAS takes Q4_0, Q8_0,
    # Q5_0 and IQ4_NL prompts (the last two unpacking more), the k-quants and the other i-quants
    # a per-row vec_dot (Q4_K_S 108 tok/s against Q4_0's 154 on one Ryzen-7950X).
    gemm_compute: dict[str, float] = field(default_factory=dict)
    # The routed experts' GEMMs' compute fraction, by compute dtype, where the engine runs them
    # through a slower kernel than its dense GEMMs: mainline llama.cpp's mul_mat_id takes every
    # type through the per-row vec_dot, one expert after another, where a dense Q8_0 or Q4_0
    # GEMM takes tinyBLAS (40-50% faster when it landed, ik_llama.cpp PR 533). A block type's
    # own gemm_compute entry (a k-quant's: vec_dot already) still comes first.
    experts_compute: dict[str, float] = field(default_factory=dict)

    def compute_fraction(self, weight_dtype: str, compute_dtype: str, experts: bool = False) -> float | None:
        """The GEMM's fraction of the compute peak: its weights' block type's entry (a GGML file
        type that mixes blocks: its default block type's), else (the routed experts' GEMMs) the
        experts' own entry for its compute dtype, else its compute dtype's, else None (the
        efficiency curve prices both roofs)."""
        for key in (weight_dtype, GGML_MIXES.get(weight_dtype, {}).get("default")):
            if key in self.gemm_compute:
                return self.gemm_compute[key]
        if experts and compute_dtype in self.experts_compute:
            return self.experts_compute[compute_dtype]
        return self.gemm_compute.get(compute_dtype)

    def gemm_efficiency(self, weight_dtype: str, rows: float) -> float:
        # a dequantizing or integer kernel (int4, mxfp4, GGML types) without its own curve: int8's
        for key in (weight_dtype, efficiency_dtype(weight_dtype), self.compute_dtype):
            if key in self.gemm:
                return self.gemm[key](rows)
        raise KeyError(f"profile {self.name} has no GEMM curve for {weight_dtype} nor {self.compute_dtype}")

    def decode_path(self, architecture: str, layer_kind: str) -> str:
        """The path a decode step runs: "decode_fused", or the torch path ("*" among the
        torch_decode_architectures: every architecture, a CPU without tacit's C++ kernels), whose
        fixed costs follow the layer (ModelShape.layer_kind) where the profile fitted them: a
        dense layer is ~a dozen torch ops ("torch_dense"), a GQA layer with a routed MoE more
        ("torch_moe"), DeepSeek's MLA and MoE layer the most ("torch")."""
        torch_path = architecture in self.torch_decode_architectures or "*" in self.torch_decode_architectures
        if not torch_path:
            return "decode_fused"
        key = {"dense": "torch_dense", "moe": "torch_moe"}.get(layer_kind, "torch")
        return key if key in self.step_overhead_s else "torch"


def _curve(v: float | dict) -> Curve:
    """A curve from the data file; a bare number is flat (the stated-assumption profiles)."""
    if isinstance(v, dict):
        return Curve(tuple(v["rows"] if "rows" in v else v["bytes"]), tuple(v["eff"]))
    return Curve((1.0,), (float(v),))


def _profile(name: str, d: dict) -> Profile:
    return Profile(
        name=name,
        gemm={k: Curve(tuple(v["rows"]), tuple(v["eff"])) for k, v in d["gemm"].items()},
        attention_decode=d["attention_decode"],
        attention_prefill=_curve(d["attention_prefill"]),
        attention_prefill_mla=_curve(d.get("attention_prefill_mla", d["attention_prefill"])),
        elementwise=_curve(d["elementwise"]),
        sampling=_curve(d.get("sampling", d["elementwise"])),
        op_overhead_s=d["op_overhead_s"],
        step_overhead_s=d["step_overhead_s"],
        layer_overhead_s=d["layer_overhead_s"],
        torch_decode_architectures=tuple(d.get("torch_decode_architectures", ())),
        reduce_bytes=int(d.get("reduce_bytes", 2)),
        source=d["source"],
        roofs=d.get("roofs"),
        graph_op_overhead_s=d.get("graph_op_overhead_s"),
        graph_step_overhead_s=float(d.get("graph_step_overhead_s", 0.0)),
        compute_dtype=d.get("compute_dtype", "bf16"),
        attention_decode_torch=_curve(d["attention_decode_torch"]) if "attention_decode_torch" in d else None,
        attention_decode_torch_group_s=float(d.get("attention_decode_torch_group_s", 0.0)),
        row_overhead_s=d.get("row_overhead_s", {}),
        row_layer_overhead_s=d.get("row_layer_overhead_s", {}),
        gemm_compute={k: float(v) for k, v in d.get("gemm_compute", {}).items()},
        experts_compute={k: float(v) for k, v in d.get("experts_compute", {}).items()},
    )


@functools.cache
def _all(path: str) -> dict[str, dict]:
    return json.loads(Path(path).read_text())


# Profiles a hardware file brought inline, by the name its spec carries (hardware_file.py).
_REGISTERED: dict[str, Profile] = {}


def register_profile(name: str, d: dict) -> Profile:
    """Add an inline profile (efficiency.json's schema, `same_as` a shipped profile included) for
    this process; a missing key or a wrong type is a ValueError naming it. Returns the parsed
    profile."""
    if name in _all(str(DATA)):
        raise ValueError(f"profile name {name!r} is taken by efficiency.json")
    if "same_as" in d:
        base = d["same_as"]
        if base not in _all(str(DATA)):
            valid = ", ".join(_all(str(DATA)))
            raise ValueError(f"inline efficiency profile's same_as {base!r} is not a shipped profile; valid: {valid}")
        d = _over(profile_entry(base), d)
    try:
        profile = _profile(name, d)
    except KeyError as e:
        raise ValueError(f"inline efficiency profile lacks {e.args[0]!r}") from None
    except (TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"inline efficiency profile is malformed: {e}") from None
    _REGISTERED[name] = profile
    return profile


def profile_names(path: Path = DATA) -> list[str]:
    return [*_all(str(path)), *_REGISTERED]


def load_profile(name: str, path: Path = DATA) -> Profile:
    if path == DATA and name in _REGISTERED:
        return _REGISTERED[name]
    profiles = _all(str(path))
    if name == "this-cpu" and name not in profiles:
        raise ValueError(
            "efficiency profile 'this-cpu' is this machine's own fit, not a shipped entry: "
            "tacit.perf_model.calibration.profile_for(spec) (`tacit predict --calibrate` makes it)"
        )
    if name not in profiles:
        raise ValueError(f"efficiency profile {name!r} is not in {path}; valid: {', '.join(profiles)}")
    return _profile(name, profile_entry(name, path))


def profile_entry(name: str, path: Path = DATA) -> dict:
    """A shipped profile's entry as priced. One with `same_as` is another engine version on the
    same part: it takes that profile's entry and states only what differs (its own source,
    engine, the figures it changes and the numbers they describe), so the shared numbers have
    one home."""
    d = _all(str(path))[name]
    return _over(profile_entry(d["same_as"], path), d) if "same_as" in d else d


def _over(base: dict, own: dict) -> dict:
    """`own`'s keys over `base`'s (its figures over base's figures), `same_as` dropped."""
    own = {k: v for k, v in own.items() if k != "same_as"}
    return {**base, **own, "figures": {**base.get("figures", {}), **own.get("figures", {})}}


def fitted_roofs(spec: HardwareSpec, profile: Profile) -> HardwareSpec:
    """`this-cpu` re-measures its roofs in every process; its efficiencies are fractions of the
    roofs measured when they were fitted, so predict against those (stored with the profile).
    Otherwise a process that happens to measure 8% less bandwidth (41.0 -> 37.7 GB/s seen here)
    would predict every memory-bound operator 8% slower while the kernels run at the same speed."""
    if spec.name != "this-cpu" or not profile.roofs:
        return spec
    peak, bw = profile.roofs["bf16_flops"], profile.roofs["read_bandwidth"]
    src = f"the roofs {profile.name}'s efficiencies were fitted against ({profile.source})"
    # int8 stands in with bf16's (specs.py); the fitted peak is the compute dtype's, so a bf16
    # fit keeps this process's own float32 figure (an AMX CPU's fp32 matmul is ~10x slower)
    kept = () if profile.compute_dtype == "fp32" else ("fp32",)
    flops = {k: v if k in kept else Sourced(peak, src) for k, v in spec.flops.items()}
    return replace(spec, flops=flops, memory_bandwidth=Sourced(bw, src))
