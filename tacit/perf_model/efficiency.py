"""Efficiency profiles: the fraction of a roof each operator class reaches, and fixed costs.

data/efficiency.json holds one profile per named kind of hardware: stated assumptions, marked
so, or a fit made on that part (`python -m tacit.perf_model.fit --name NAME --out FILE`).
`this-cpu` has no entry: each machine fits its own, cached (calibration.py).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

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
    # per step and per layer, by the path a step runs ("decode_fused", "torch"): Python, scheduling
    step_overhead_s: dict[str, float]
    layer_overhead_s: dict[str, float]
    torch_decode_architectures: tuple[str, ...]  # architectures whose decode runs the torch path
    reduce_bytes: int  # bytes per value of a tensor-parallel all-reduce
    source: str
    # the roofs (bf16_flops, read_bandwidth) the efficiencies were fitted against: a fitted
    # profile predicts with these, not with roofs re-measured in the predicting process (this
    # CPU's read bandwidth moved 41.0 -> 37.7 GB/s between two processes on the shared machine)
    roofs: dict[str, float] | None = None

    def gemm_efficiency(self, weight_dtype: str, rows: float) -> float:
        # a dequantizing 4-bit kernel (int4, mxfp4) without its own curve: int8's
        key = weight_dtype if weight_dtype in self.gemm else ("int8" if weight_dtype in ("int4", "mxfp4") else "bf16")
        return self.gemm.get(key, self.gemm["bf16"])(rows)

    def decode_path(self, architecture: str) -> str:
        return "torch" if architecture in self.torch_decode_architectures else "decode_fused"


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
    )


@functools.cache
def _all(path: str) -> dict[str, dict]:
    return json.loads(Path(path).read_text())


def load_profile(name: str, path: Path = DATA) -> Profile:
    profiles = _all(str(path))
    if name == "this-cpu" and name not in profiles:
        raise ValueError(
            "efficiency profile 'this-cpu' is this machine's own fit, not a shipped entry: "
            "tacit.perf_model.calibration.profile_for(spec) (`tacit predict --calibrate` makes it)"
        )
    if name not in profiles:
        raise ValueError(f"efficiency profile {name!r} is not in {path}; valid: {', '.join(profiles)}")
    d = profiles[name]
    if "same_as" in d:  # a profile that borrows another's fitted numbers (say why in its source)
        return _profile(name, {**profiles[d["same_as"]], "source": d["source"]})
    return _profile(name, d)
