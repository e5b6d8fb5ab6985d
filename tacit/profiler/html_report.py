"""profile.json -> report.html: one file, inline CSS and SVG, nothing fetched from anywhere."""

from __future__ import annotations

from html import escape
from typing import Any

from tacit.profiler.categories import CATEGORIES, LABELS, layer_sort_key
from tacit.profiler.compare import TABLE_HEADER, table_rows
from tacit.profiler.svg import roofline, stacked_bars

SECTIONS = ("summary", "breakdown", "layers", "roofline", "communication", "predicted")

_CSS = """
body { font-family: sans-serif; margin: 2em; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.note { color: #555; font-size: 13px; }
"""


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(p: dict[str, Any]) -> str:
    model, wl, hw = p.get("model", {}), p.get("workload", {}), p.get("hw")
    lines = [
        f"model: {model.get('name', '?')} ({model.get('dtype', '?')}, {model.get('num_layers', '?')} layers, "
        f"weights {model.get('weight_bytes', 0) / 1e6:.0f} MB)",
        f"engine: {p.get('engine', {})}",
        f"workload: {wl}",
    ]
    if hw:
        lines.append(
            f"roofs ({hw['source']}): peak read {hw['read_GBps']:.1f} GB/s, matmul (the faster of bf16 and float32) "
            f"{hw['bf16_TFLOPs']:.2f} TFLOP/s, ridge point {hw['ridge']:.1f} FLOP/byte"
        )
    else:
        lines.append("roofs: not measured (--no-measure-hw without --hw-json)")
    rows = [
        [
            kind,
            str(k["steps"]),
            f"{k['tokens_per_step']['median']:.0f}",
            _ms(k["step_s"]["median"]),
            f"{_ms(k['step_s']['p10'])} - {_ms(k['step_s']['p90'])}",
        ]
        for kind, k in p["kinds"].items()
    ]
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return f"<ul>{items}</ul>" + table(["step kind", "steps", "tokens/step", "median ms", "p10 - p90 ms"], rows)


def _breakdown(p: dict[str, Any]) -> str:
    out = [
        '<p class="note">Per step kind: each operator class\'s median and p10-p90 over steps, and its '
        "mean, whose sum over classes is the mean step time (Python/host is the step's wall time "
        "minus every measured class).</p>"
    ]
    bars = [(kind, {c: k["categories"][c]["mean"] for c in CATEGORIES}) for kind, k in p["kinds"].items()]
    out.append(stacked_bars(bars))
    for kind, k in p["kinds"].items():
        mean_step = k["step_s"]["mean"]
        rows = []
        for c in CATEGORIES:
            st = k["categories"][c]
            share = 100 * st["mean"] / mean_step if mean_step else 0.0
            rows.append(
                [LABELS[c], _ms(st["median"]), f"{_ms(st['p10'])} - {_ms(st['p90'])}", _ms(st["mean"]), f"{share:.1f}%"]
            )
        total = sum(k["categories"][c]["mean"] for c in CATEGORIES)
        rows.append(["sum of means / mean step", "", "", _ms(total), f"{_ms(mean_step)} ms"])
        out.append(f"<h3>{escape(kind)}</h3>")
        out.append(table(["class", "median ms", "p10 - p90 ms", "mean ms", "share"], rows))
    return "".join(out)


def _layers(p: dict[str, Any]) -> str:
    out = [
        '<p class="note">Median ms per step by decoder layer and class ("head": final norm, lm_head, '
        "sampling); profile.json also holds the means (layers). Python/host here is only what was "
        "measured inside the layer (residual adds, glue between its modules).</p>"
    ]
    for kind, k in p["kinds"].items():
        per = k["layers_median"]
        names = sorted(per, key=layer_sort_key)
        out.append(f"<h3>{escape(kind)}</h3>")
        out.append(stacked_bars([(ly, per[ly]) for ly in names]))
        rows = [[ly] + [_ms(per[ly].get(c, 0.0)) for c in CATEGORIES] for ly in names]
        out.append(table(["layer"] + [LABELS[c] for c in CATEGORIES], rows))
    return "".join(out)


def _roofline(p: dict[str, Any]) -> str:
    hw = p.get("hw")
    out = []
    if hw:
        out.append(
            f'<p class="note">Roofs: {hw["read_GBps"]:.1f} GB/s read, {hw["bf16_TFLOPs"]:.2f} TFLOP/s matmul; ridge point '
            f"{hw['ridge']:.1f} FLOP/byte: a class left of it is bound by memory bandwidth, right of it by compute.</p>"
        )
    else:
        out.append('<p class="note">Roofs not measured: points only.</p>')
    for kind, k in p["kinds"].items():
        rl = k["roofline"]
        out.append(f"<h3>{escape(kind)}</h3>")
        points = {c: (r["intensity"], r["achieved_flops"]) for c, r in rl.items()}
        out.append(roofline(points, hw["read_GBps"] * 1e9 if hw else None, hw["bf16_TFLOPs"] * 1e12 if hw else None))
        rows = []
        for c, r in rl.items():
            roof = min(hw["bf16_TFLOPs"] * 1e12, hw["read_GBps"] * 1e9 * r["intensity"]) if hw else None
            rows.append(
                [
                    LABELS[c],
                    f"{r['flops_per_step'] / 1e9:.4g}",
                    f"{r['bytes_per_step'] / 1e6:.4g}",
                    f"{r['intensity']:.3g}",
                    f"{r['achieved_flops'] / 1e9:.4g}",
                    f"{r['achieved_Bps'] / 1e9:.3g}",
                    f"{100 * r['achieved_flops'] / roof:.1f}%" if roof else "-",
                ]
            )
        out.append(table(["class", "GFLOP/step", "MB/step", "FLOP/byte", "GFLOP/s", "GB/s", "of roof"], rows))
    return "".join(out)


def _communication(p: dict[str, Any]) -> str:
    comm = p.get("communication") or {}
    if not comm:
        return '<p class="note">No communication: one process (ModelRunner.communication_seconds() is empty).</p>'
    steps = max(len(p.get("steps", [])), 1)
    rows = [[ly, _ms(s), _ms(s / steps)] for ly, s in comm.items()]
    out = (
        '<p class="note">Seconds this rank (rank 0) blocked in collectives, per layer: exposed communication, '
        "waiting for the slowest rank included.</p>" + table(["layer", "total ms", "ms per step"], rows)
    )
    ranks = p.get("ranks") or []
    if len(ranks) > 1:
        per_rank = [
            [
                str(r["rank"]),
                _ms(r["execute_s"] / steps),
                _ms(r["communication_s"] / steps),
                f"{100 * r['communication_s'] / r['execute_s']:.1f}%" if r["execute_s"] > 0 else "-",
            ]
            for r in ranks
        ]
        out += (
            '<p class="note">Per rank, over the profiled steps: time in the model runner\'s steps and the part '
            "blocked in collectives. A rank that waits much longer than the others is the faster one: it "
            "waits for the slowest (uneven experts under expert parallelism, a busier core).</p>"
            + table(["rank", "step ms per step", "blocked ms per step", "blocked share"], per_rank)
        )
    return out


def _predicted(p: dict[str, Any]) -> str:
    dev = p.get("deviations") or {}
    source = p.get("predicted_by")
    if not dev:
        why = escape(source) if source else "no prediction was given (pass --predicted FILE or --predict-hardware)"
        return f'<p class="note">Nothing to compare: {why}.</p>'
    by = f" ({escape(source)})" if source else ""
    out = [f'<p class="note">Predicted{by} against measured mean seconds per step, largest deviation first.</p>']
    for kind, rows in dev.items():
        out.append(f"<h3>{escape(kind)}</h3>")
        body = [
            [
                LABELS[r["category"]],
                _ms(r["predicted_s"]),
                _ms(r["measured_s"]),
                _ms(r["deviation_s"]),
                f"{100 * r['deviation_s'] / r['predicted_s']:+.0f}%" if r["predicted_s"] else "-",
            ]
            for r in rows
        ]
        out.append(table(["class", "predicted ms", "measured ms", "measured - predicted ms", "vs predicted"], body))
    return "".join(out)


def render(profile: dict[str, Any]) -> str:
    """The report for a profile.json's contents."""
    parts = {
        "summary": ("Summary", _summary),
        "breakdown": ("Time per step kind and operator class", _breakdown),
        "layers": ("Time per layer", _layers),
        "roofline": ("Roofline", _roofline),
        "communication": ("Communication", _communication),
        "predicted": ("Predicted vs measured", _predicted),
    }
    return page("tacit profile", [(sid, title, fn(profile)) for sid, (title, fn) in parts.items()])


def page(title: str, sections: list[tuple[str, str, str]]) -> str:
    """One self-contained HTML document: (id, heading, body HTML) per section; `tacit predict
    --html` writes its report with this too."""
    body = "".join(f'<section id="{sid}"><h2>{escape(head)}</h2>{html}</section>' for sid, head, html in sections)
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>"
    )


def render_compare(cmp: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> str:
    """compare.json (profiler/compare.py) as one page: the header, then per step kind A's and B's
    stacked bars on one scale and the table; a and b: the two profiles, for the bars."""
    head = [f"A: {cmp['a']['path']}", f"B: {cmp['b']['path']}"]
    head += [f"warning: {w}" for w in cmp["warnings"]] + [f"note: {n}" for n in cmp["notes"]]
    out = ["<ul>" + "".join(f"<li>{escape(line)}</li>" for line in head) + "</ul>"]
    out.append(
        '<p class="note">Mean ms per step by operator class (the means add up to the mean step), '
        "largest change first; each kind's two bars share one scale.</p>"
    )
    for kind, k in cmp["kinds"].items():
        bars = [
            (side, {c: p["kinds"][kind]["categories"][c]["mean"] for c in p["kinds"][kind]["categories"]})
            for side, p in (("A", a), ("B", b))
            if kind in p["kinds"]
        ]
        absent = [side for side, n in (("A", k["a_steps"]), ("B", k["b_steps"])) if not n]
        out.append(f"<h3>{escape(kind)}</h3>")
        if absent:
            out.append(f'<p class="note">No {escape(kind)} steps in {absent[0]}.</p>')
        out.append(stacked_bars(bars))
        out.append(table(TABLE_HEADER, table_rows(k)))
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>tacit profile --compare</title>'
        f"<style>{_CSS}</style></head><body><h1>tacit profile --compare</h1>{''.join(out)}</body></html>"
    )
