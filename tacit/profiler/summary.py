"""Steps -> profile.json: per step kind, medians and p10-p90 per category, mean seconds per layer
and category, the roofline points, communication per layer and the predicted comparison."""

from __future__ import annotations

from typing import Any

import numpy as np

from tacit.profiler.categories import CATEGORIES, STEP_KINDS, layer_sort_key
from tacit.profiler.collect import StepRecord
from tacit.profiler.roofline import ModelShapes, Roofs, step_work

PROFILE_VERSION = 1


def stats(values: list[float]) -> dict[str, float]:
    """Median, p10, p90, mean and stdev: the jitter across steps is the p10-p90 spread."""
    a = np.asarray(values, dtype=np.float64)
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return {
        "median": float(p50),
        "p10": float(p10),
        "p90": float(p90),
        "mean": float(a.mean()),
        "stdev": float(a.std()),
    }


def _kind_summary(steps: list[StepRecord], shapes: ModelShapes) -> dict[str, Any]:
    n = len(steps)
    categories = {c: stats([s.categories.get(c, 0.0) for s in steps]) for c in CATEGORIES}
    layer_names = sorted({ly for s in steps for ly in s.layers}, key=layer_sort_key)
    # Means add up to the mean step; medians are what to read on a shared machine, where a step
    # preempted for a scheduler quantum (4 ms here) puts its whole delay into one layer's class.
    layers = {
        ly: {c: sum(s.layers.get(ly, {}).get(c, 0.0) for s in steps) / n for c in CATEGORIES} for ly in layer_names
    }
    layers_median = {
        ly: {c: float(np.median([s.layers.get(ly, {}).get(c, 0.0) for s in steps])) for c in CATEGORIES}
        for ly in layer_names
    }
    flops: dict[str, float] = {}
    nbytes: dict[str, float] = {}
    for s in steps:
        for per in step_work(shapes, s.rows, s.num_samples).values():
            for c, (f, b) in per.items():
                flops[c] = flops.get(c, 0.0) + f
                nbytes[c] = nbytes.get(c, 0.0) + b
    roofline = {}
    for c in flops:
        seconds = sum(s.categories.get(c, 0.0) for s in steps)
        if seconds > 0 and nbytes[c] > 0:
            roofline[c] = {
                "flops_per_step": flops[c] / n,
                "bytes_per_step": nbytes[c] / n,
                "intensity": flops[c] / nbytes[c],
                "achieved_flops": flops[c] / seconds,
                "achieved_Bps": nbytes[c] / seconds,
            }
    return {
        "steps": n,
        "tokens_per_step": stats([float(sum(t for t, _ in s.rows)) for s in steps]),
        "rows_per_step": stats([float(len(s.rows)) for s in steps]),
        "step_s": stats([s.step_s for s in steps]),
        "categories": categories,
        "layers": layers,
        "layers_median": layers_median,
        "roofline": roofline,
    }


def communication_by_layer(steps: list[StepRecord]) -> dict[str, float]:
    """Seconds per layer blocked in collectives, summed over the run ({} in one process)."""
    out: dict[str, float] = {}
    for s in steps:
        for ly, per in s.layers.items():
            if per.get("communication", 0.0) > 0:
                out[ly] = out.get(ly, 0.0) + per["communication"]
    return dict(sorted(out.items(), key=lambda kv: layer_sort_key(kv[0])))


def check_predicted(predicted: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{kind: {category: seconds}} from either that or a flat {category: seconds} (taken as decode)."""
    if predicted and all(isinstance(v, (int, float)) for v in predicted.values()):
        predicted = {"decode": predicted}
    out: dict[str, dict[str, float]] = {}
    for kind, per in predicted.items():
        if kind not in STEP_KINDS or not isinstance(per, dict):
            raise ValueError(f"predicted: {kind!r} is not a step kind; valid: {', '.join(STEP_KINDS)}")
        for c, v in per.items():
            if c not in CATEGORIES or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(
                    f"predicted[{kind!r}]: {c!r}: {v!r} must be seconds >= 0 for one of {', '.join(CATEGORIES)}"
                )
        out[kind] = {c: float(v) for c, v in per.items()}
    return out


def deviations(kinds: dict[str, Any], predicted: dict[str, dict[str, float]]) -> dict[str, list[dict[str, Any]]]:
    """Per kind, predicted beside measured (mean per step) per category, largest |deviation| first."""
    out = {}
    for kind, per in predicted.items():
        if kind not in kinds:
            continue
        rows = []
        for c, p in per.items():
            m = kinds[kind]["categories"][c]["mean"]
            rows.append({"category": c, "predicted_s": p, "measured_s": m, "deviation_s": m - p})
        out[kind] = sorted(rows, key=lambda r: -abs(r["deviation_s"]))
    return out


def summarize(
    steps: list[StepRecord],
    shapes: ModelShapes,
    roofs: Roofs | None,
    meta: dict[str, Any],
    predicted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole profile.json. meta: model, engine and workload description."""
    if not steps:
        raise ValueError("no engine step ran the model: nothing to profile")
    kinds = {}
    for kind in STEP_KINDS:
        of_kind = [s for s in steps if s.kind == kind]
        if of_kind:
            kinds[kind] = _kind_summary(of_kind, shapes)
    pred = check_predicted(predicted or {})
    return {
        "version": PROFILE_VERSION,
        **meta,
        "categories": list(CATEGORIES),
        "hw": roofs.to_json() if roofs else None,
        "kinds": kinds,
        # Prompt tokens the prefix cache supplied against the tokens the steps computed.
        "tokens": {
            "computed": sum(n for s in steps for n, _ in s.rows),
            "cached": sum(s.cached_tokens for s in steps),
        },
        "communication": communication_by_layer(steps),
        "predicted": pred,
        "deviations": deviations(kinds, pred),
        "steps": [s.to_json() for s in steps],
    }
