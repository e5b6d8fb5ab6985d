"""The performance model's figures for a profiled run, in the profiler's categories: the
"predicted" column of the report (`tacit predict` on the same shape, batch and hardware)."""

from __future__ import annotations

from typing import Any

from tacit.perf_model.dtypes import weight_bytes_per_value
from tacit.perf_model.memory import weight_bytes as model_weight_bytes
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import Parallel
from tacit.perf_model.predict import Workload, predict
from tacit.perf_model.roofline import OpTime
from tacit.platforms.hardware_table import get_hardware_spec
from tacit.profiler.categories import CATEGORIES

# The model's operator classes -> the profiler's. Projections, dense MLPs and lm_head are GEMMs
# here as in categories.py; the model's fixed per-step and per-layer costs are host time.
MODEL_CLASS_CATEGORY = {
    "attn_proj": "gemm",
    "dense_mlp": "gemm",
    "lm_head": "gemm",
    "attention": "attention",
    "moe_routing": "moe_routing",
    "experts": "experts",
    "norm_elementwise": "norm",
    "sampling": "sampling",
    "communication": "communication",
}


def weight_dtype_of(hf: dict[str, Any], held_bytes: int, parallel: Parallel) -> str:
    """The model's weight type nearest the bytes a weight value takes in this engine: a GGUF
    kept in its blocks may mix types (Q4_1 layers, a Q8_0 head), and the mean decides what a
    step streams. held_bytes: what this rank holds (bench.latency.weight_bytes)."""
    values = model_weight_bytes(shape_from_hf(hf), parallel, "bf16") / 2
    per_value = held_bytes / max(values, 1.0)
    candidates = {"bf16": weight_bytes_per_value("bf16"), "int8": weight_bytes_per_value("int8")}
    candidates["int4"] = weight_bytes_per_value("int4", 32)
    return min(candidates, key=lambda k: abs(candidates[k] - per_value))


def predicted_categories(
    hf: dict[str, Any],
    batch: int,
    input_len: int,
    output_len: int,
    weight_dtype: str,
    kv_dtype: str,
    parallel: Parallel,
    hardware: str,
) -> dict[str, dict[str, float]]:
    """{"prefill": {category: seconds}, "decode": {...}} for one prefill step of the batch and the
    mean decode step, as `tacit predict` prices them on `hardware`."""
    pred = predict(
        shape_from_hf(hf),
        get_hardware_spec(hardware),
        Workload(
            batch,
            input_len,
            output_len,
            weight_dtype,
            kv_dtype,
            parallel=parallel,
        ),
    )
    return {
        "prefill": categories_of(pred.prefill_ops, pred.prefill_step_s),
        "decode": categories_of(pred.decode_ops, pred.tpot_s),
    }


def categories_of(ops: list[OpTime], step_s: float) -> dict[str, float]:
    """{category: seconds} of one predicted step: its operators by class, and the rest of the
    step (the model's fixed per-step and per-layer cost) as host time."""
    per = dict.fromkeys(CATEGORIES, 0.0)
    for t in ops:
        per[MODEL_CLASS_CATEGORY[t.op.op_class]] += t.seconds
    per["host"] += max(step_s - sum(per.values()), 0.0)
    return per


def roofline_points(ops: list[OpTime]) -> dict[str, tuple[float, float]]:
    """{category: (FLOP per byte, FLOP/s it is predicted to reach)} of one predicted step, as
    the profile's roofline places a measured class; communication (no FLOPs) has no point."""
    sums: dict[str, list[float]] = {}
    for t in ops:
        s = sums.setdefault(MODEL_CLASS_CATEGORY[t.op.op_class], [0.0, 0.0, 0.0])
        s[0], s[1], s[2] = s[0] + t.op.flops, s[1] + t.op.bytes, s[2] + t.seconds
    return {c: (f / b, f / sec) for c, (f, b, sec) in sums.items() if f > 0 and b > 0 and sec > 0}
