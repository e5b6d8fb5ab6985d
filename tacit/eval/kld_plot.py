"""`tacit eval plot-kld A.json B.json ... --plot OUT.png`: KLD against bits per weight, one
labelled point per quantization.

`tacit eval kld` scores one model against one reference a run (as llama.cpp's
`llama-perplexity --kl-divergence` does), so a quantization sweep is one run per quantization,
each with --json; this draws those files together. A point is labelled with its file's name
(int8.json -> "int8"); a file with a llama.cpp peer adds that engine's point at the same bits
(it scored the same file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tacit.plotting import pyplot, require_plotting


def load_points(paths: list[str]) -> list[tuple[str, float, float]]:
    """(label, bits per weight, KLD mean) of each `tacit eval kld --json` file, and of its peers."""
    points = []
    for path in paths:
        try:
            r = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path}: no such file (write one with `tacit eval kld ... --json {path}`)"
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e}); expected `tacit eval kld --json` output") from None
        if not isinstance(r, dict) or not isinstance(r.get("kld_mean"), (int, float)):
            raise ValueError(f"{path}: has no kld_mean; expected `tacit eval kld --json` output")
        bits = r.get("bits_per_weight")
        if not isinstance(bits, (int, float)) or not bits > 0:
            raise ValueError(f"{path}: has no bits_per_weight (written before it was recorded?); rerun tacit eval kld")
        label = Path(path).stem
        runs = [(label, r["kld_mean"])] + [
            (f"{label} ({peer})", p["kld_mean"]) for peer, p in r.get("peers", {}).items()
        ]
        for name, kld in runs:
            if not kld > 0:
                raise ValueError(
                    f"{path}: {name}'s KLD mean is {kld} (it scores as the reference): a log axis cannot show it; "
                    "leave that file out"
                )
            points.append((name, float(bits), float(kld)))
    return points


def plot_kld(points: list[tuple[str, float, float]], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([b for _, b, _ in points], [k for _, _, k in points], s=24)
    for label, bits, kld in points:
        ax.annotate(label, (bits, kld), textcoords="offset points", xytext=(5, 4), fontsize=9)
    ax.set_yscale("log")
    ax.margins(x=0.15, y=0.2)  # room for the labels right of the outermost points
    ax.set_xlabel("bits per weight (linear layers, experts, lm_head; as held)")
    ax.set_ylabel("KLD mean against the reference")
    ax.set_title("tacit eval kld: divergence against size")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_plot_kld(args: argparse.Namespace) -> int:
    require_plotting(args.plot)
    plot_kld(load_points(args.results), args.plot)
    print(f"tacit: wrote {args.plot}", file=sys.stderr)
    return 0


def add_plot_kld_parser(esub: argparse._SubParsersAction) -> None:
    p = esub.add_parser("plot-kld", help="KLD against bits per weight, from several `tacit eval kld --json` files")
    p.add_argument("results", nargs="+", help="`tacit eval kld --json` files, one per quantization (label: file name)")
    p.add_argument("--plot", required=True, help="the PNG to write (needs matplotlib: pip install -e '.[bench]')")
    p.set_defaults(func=cmd_plot_kld)
