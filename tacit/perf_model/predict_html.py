"""`tacit predict --html FILE`: the predicted steps drawn as `tacit profile` draws measured ones
(the same stacked bars and roofline, tacit/profiler/svg.py, in the profiler's operator classes),
with every operator of each step in a table. One file, inline SVG, nothing fetched."""

from __future__ import annotations

from html import escape

from tacit.perf_model.calibration import profile_for
from tacit.perf_model.predict import Prediction, fitted_roofs
from tacit.perf_model.roofline import OpTime
from tacit.platforms.specs import HardwareSpec
from tacit.profiler.categories import LABELS
from tacit.profiler.html_report import page, table
from tacit.profiler.predicted import categories_of, roofline_points
from tacit.profiler.svg import roofline, stacked_bars


def _steps(pred: Prediction, speculative: bool) -> list[tuple[str, list[OpTime], float]]:
    prefill = [("prefill", pred.prefill_ops, pred.prefill_step_s)] if pred.prefill_ops else []  # none at input 0
    return [*prefill, ("verify" if speculative else "decode", pred.decode_ops, pred.decode_step_s)]


def _ops_table(ops: list[OpTime]) -> str:
    rows = [
        [
            t.op.name,
            t.op.op_class,
            f"{1e3 * t.seconds:.4f}",
            f"{1e3 * t.compute_s:.4f}",
            f"{1e3 * t.memory_s:.4f}",
            f"{t.op.flops / max(t.op.bytes, 1.0):.3g}",
            t.bound,
        ]
        for t in ops
    ]
    return table(["operator", "class", "ms", "compute ms", "memory/link ms", "FLOP/byte", "bound"], rows)


def render_prediction(pred: Prediction, spec: HardwareSpec, heading: str, speculative: bool = False) -> str:
    """The report of one prediction: `heading` is the line `tacit predict` prints first (model,
    hardware, workload); speculative names the decode step a verify step."""
    # The roofs the operators were priced against (this-cpu: those its efficiencies were fitted on).
    roofs = fitted_roofs(spec, profile_for(spec))
    read_Bps, flops = roofs.memory_bandwidth.value, roofs.peak_flops("bf16")
    steps = _steps(pred, speculative)
    summary = f"<p>{escape(heading)}</p>" + table(
        ["TTFT ms", "TPOT ms", "output tok/s", "memory GB per device", "fits"],
        [
            [
                f"{1e3 * pred.ttft_s:.3f}" if pred.ttft is not None else "none (no prefill)",
                f"{1e3 * pred.tpot_s:.4f}",
                f"{pred.throughput_tok_s:.1f}",
                f"{pred.memory.total / 1e9:.2f} of {pred.capacity_bytes / 1e9:.1f}",
                "yes" if pred.fits else "NO",
            ]
        ],
    )
    breakdown = [
        '<p class="note">Each predicted step by operator class, as <code>tacit profile</code> splits a measured '
        "one (projections, MLPs and lm_head are GEMM); Python/host is the model's fixed per-step and per-layer "
        "cost.</p>",
        stacked_bars([(kind, categories_of(ops, step_s)) for kind, ops, step_s in steps]),
    ]
    for kind, ops, step_s in steps:
        breakdown.append(f"<h3>{escape(kind)} step, {1e3 * step_s:.3f} ms</h3>{_ops_table(ops)}")
    rl = [
        f'<p class="note">Roofs ({escape(roofs.name)}): {read_Bps / 1e9:.1f} GB/s, {flops / 1e12:.2f} TFLOP/s bf16; '
        f"ridge point {flops / read_Bps:.1f} FLOP/byte. A class's point is its FLOPs over its bytes and the "
        "FLOP/s its predicted time gives.</p>"
    ]
    for kind, ops, _ in steps:
        points = roofline_points(ops)
        rl.append(f"<h3>{escape(kind)}</h3>{roofline(points, read_Bps, flops)}")
        rl.append(
            f'<p class="note">{escape(", ".join(f"{LABELS[c]} {x:.3g} FLOP/B" for c, (x, _) in points.items()))}</p>'
        )
    sections = [
        ("summary", "Summary", summary),
        ("breakdown", "Time per step and operator class", "".join(breakdown)),
        ("roofline", "Roofline", "".join(rl)),
    ]
    return page("tacit predict", sections)
