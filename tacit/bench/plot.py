"""--plot output (matplotlib is a bench extra, imported only when a plot is asked for)."""

from __future__ import annotations

from tacit.plotting import pyplot as _plt
from tacit.plotting import require_plotting as require_plotting  # the bench commands' one name for it


def plot_lines(
    rows: list[dict], x: str, y: str, path: str, title: str, log: bool = False, xticks: dict | None = None
) -> None:
    """One line per rows' "engine"; log: both axes log scale; xticks: {x value: its label}."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["engine"] for r in rows):
        pts = [(r[x], r[y]) for r in rows if r["engine"] == name]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    if log:
        ax.set_xscale("log"), ax.set_yscale("log")
    if xticks:
        ax.set_xticks(list(xticks), list(xticks.values()))
        ax.set_xticks([], minor=True)  # a log axis's minor ticks would crowd the labelled ones
        ax.tick_params(axis="x", labelrotation=45)  # 16MB and 32MB sit one label-width apart on a log axis
    ax.set_xlabel(x), ax.set_ylabel(y), ax.set_title(title), ax.legend(), ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_bars(rows: list[dict], y: str, path: str, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([r["engine"] for r in rows], [r[y] for r in rows])
    ax.set_ylabel(y), ax.set_title(title), ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _cdf(ax, series: dict[str, list[float]], xlabel: str) -> None:
    for name, values in series.items():
        v = sorted(values)
        ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=name)
    ax.set_xlabel(xlabel), ax.set_ylabel("fraction of requests"), ax.legend(), ax.grid(alpha=0.3)


def plot_cdf(series: dict[str, list[float]], xlabel: str, path: str, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    _cdf(ax, series, xlabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_cdf_panels(panels: dict[str, dict[str, list[float]]], path: str, title: str) -> None:
    """{panel's x label (a metric): {series (a policy): values}}: one CDF panel per metric, side by side."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (xlabel, series) in zip(axes[0], panels.items()):
        _cdf(ax, series, xlabel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_grouped_bars(groups: dict[str, dict[str, float]], ylabel: str, path: str, title: str) -> None:
    """{group (a workload): {series (an engine): value}}: one cluster of bars per group."""
    plt = _plt()
    series = list(dict.fromkeys(s for values in groups.values() for s in values))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, name in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [values.get(name, 0.0) for values in groups.values()], width, label=name)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel), ax.set_title(title), ax.legend(), ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_predicted_vs_measured(series: dict[str, list[tuple[float, float]]], unit: str, path: str, title: str) -> None:
    """{series: [(measured, predicted), ...]} on log-log axes, with y = x and a +-10% band: a
    point inside the band is predicted within 10%."""
    plt = _plt()
    values = [v for pts in series.values() for p in pts for v in p if v > 0]
    if not values:
        raise ValueError(f"{path}: no positive (measured, predicted) pair to plot")
    lo, hi = min(values) / 1.5, max(values) * 1.5
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.fill_between([lo, hi], [0.9 * lo, 0.9 * hi], [1.1 * lo, 1.1 * hi], color="0.85", label="within 10%")
    ax.plot([lo, hi], [lo, hi], color="0.3", lw=1, label="predicted = measured")
    for name, pts in series.items():
        ax.scatter([m for m, _ in pts], [p for _, p in pts], s=18, label=name)
    ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlim(lo, hi), ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {unit}"), ax.set_ylabel(f"predicted {unit}"), ax.set_title(title)
    ax.legend(), ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
