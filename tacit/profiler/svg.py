"""Inline SVG plots, written by hand (no matplotlib here, and the report must hold no external
file): stacked bars of seconds per category, and a log-log roofline."""

from __future__ import annotations

import math
from html import escape

from tacit.profiler.categories import CATEGORIES, LABELS

COLORS = dict(
    zip(CATEGORIES, ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c9c9c"))
)


def _text(x: float, y: float, s: str, anchor: str = "start", size: int = 11) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">{escape(s)}</text>'


def legend(x: float, y: float) -> str:
    parts = []
    for i, c in enumerate(CATEGORIES):
        cx = x + (i % 4) * 150
        cy = y + (i // 4) * 16
        parts.append(f'<rect x="{cx:.1f}" y="{cy - 9:.1f}" width="10" height="10" fill="{COLORS[c]}"/>')
        parts.append(_text(cx + 14, cy, LABELS[c]))
    return "".join(parts)


def stacked_bars(bars: list[tuple[str, dict[str, float]]], unit_scale: float = 1e3, unit: str = "ms") -> str:
    """One horizontal bar per (label, {category: seconds}), segments in CATEGORIES order."""
    label_w, bar_w, row_h = 110, 560, 18
    most = max((sum(max(v, 0.0) for v in per.values()) for _, per in bars), default=0.0) or 1.0
    height = 40 + len(bars) * row_h + 40
    out = [f'<svg width="{label_w + bar_w + 90}" height="{height}" role="img">']
    for i, (label, per) in enumerate(bars):
        y = 10 + i * row_h
        out.append(_text(label_w - 6, y + 12, label, "end"))
        x = float(label_w)
        for c in CATEGORIES:
            v = max(per.get(c, 0.0), 0.0)
            w = bar_w * v / most
            if w > 0:
                title = f"{label}: {LABELS[c]} {v * unit_scale:.3f} {unit}"
                out.append(
                    f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}" fill="{COLORS[c]}">'
                    f"<title>{escape(title)}</title></rect>"
                )
                x += w
        total = sum(max(v, 0.0) for v in per.values())
        out.append(_text(x + 4, y + 12, f"{total * unit_scale:.2f} {unit}"))
    out.append(legend(label_w, 10 + len(bars) * row_h + 18))
    out.append("</svg>")
    return "".join(out)


def roofline(points: dict[str, tuple[float, float]], read_Bps: float | None, flops: float | None) -> str:
    """points: {category: (FLOP per byte, achieved FLOP/s)} on log-log axes, under the roofs
    min(flops, read_Bps * intensity) when they are known, the ridge marked."""
    w, h, left, bottom, top, right = 640, 380, 70, 40, 20, 20
    xs = [p[0] for p in points.values() if p[0] > 0] + ([flops / read_Bps] if flops and read_Bps else [])
    ys = [p[1] for p in points.values() if p[1] > 0] + ([flops] if flops else [])
    x0, x1 = math.floor(math.log10(min(xs, default=0.1))) - 1, math.ceil(math.log10(max(xs, default=100))) + 1
    y0, y1 = math.floor(math.log10(min(ys, default=1e6))) - 1, math.ceil(math.log10(max(ys, default=1e12))) + 1

    def px(x: float) -> float:
        return left + (math.log10(x) - x0) / (x1 - x0) * (w - left - right)

    def py(y: float) -> float:
        return h - bottom - (math.log10(y) - y0) / (y1 - y0) * (h - bottom - top)

    out = [f'<svg width="{w}" height="{h}" role="img">']
    out.append(
        f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" fill="none" stroke="#999"/>'
    )
    for e in range(x0, x1 + 1):
        out.append(_text(px(10.0**e), h - bottom + 14, f"1e{e}", "middle", 10))
    for e in range(y0, y1 + 1):
        out.append(_text(left - 4, py(10.0**e) + 4, f"1e{e}", "end", 10))
    out.append(_text((w + left) / 2, h - 6, "arithmetic intensity (FLOP / byte)", "middle"))
    out.append(_text(12, top + 10, "FLOP/s"))
    if flops and read_Bps:
        ridge = flops / read_Bps
        lo, hi = 10.0**x0, 10.0**x1
        mem_start = max(lo, 10.0**y0 / read_Bps)
        out.append(
            f'<polyline fill="none" stroke="#333" stroke-width="2" points="{px(mem_start):.1f},{py(read_Bps * mem_start):.1f} '
            f'{px(ridge):.1f},{py(flops):.1f} {px(hi):.1f},{py(flops):.1f}"/>'
        )
        out.append(
            f'<line x1="{px(ridge):.1f}" y1="{py(flops):.1f}" x2="{px(ridge):.1f}" y2="{h - bottom}" stroke="#333" stroke-dasharray="4 3"/>'
        )
        out.append(_text(px(ridge) + 4, h - bottom - 6, f"ridge {ridge:.1f} FLOP/B"))
    for c, (x, y) in points.items():
        if x > 0 and y > 0:
            out.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{COLORS.get(c, "#000")}">'
                f"<title>{escape(LABELS.get(c, c))}: {x:.3g} FLOP/B, {y:.3g} FLOP/s</title></circle>"
            )
            out.append(_text(px(x) + 7, py(y) - 5, LABELS.get(c, c), size=10))
    out.append("</svg>")
    return "".join(out)
