"""The unquantized linear method's GEMM speed by activation rows, both phrasings it switches
between (layers/linear_method.py: W @ x.T up to SKINNY_ROWS, F.linear past it), timed
round-robin over `--copies` distinct k x n weights (beyond the caches, as a decode step streams
them), best of --repeats. Why perf_model/fit.py samples its GEMM curve on both sides of the switch.

    python scripts/gemm_rows_speed.py [--rows 16,32,33,40,48,64,96,128] [--dtype float32]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from tacit.perf_model.fit_small_ops import best_seconds_each


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="16,32,33,40,48,64,96,128")
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--n", type=int, default=2816)
    ap.add_argument("--copies", type=int, default=34)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    torch.manual_seed(0)
    weights = [torch.randn(a.n, a.k).to(dt) for _ in range(a.copies)]
    phrasings = {
        "W @ x.T": lambda x: [torch.mm(w, x.t()).t().contiguous() for w in weights],
        "F.linear": lambda x: [F.linear(x, w) for w in weights],
    }
    names, calls = [], []
    for rows in [int(r) for r in a.rows.split(",")]:
        x = torch.randn(rows, a.k).to(dt)
        for name, run in phrasings.items():
            names.append((rows, name))
            calls.append(lambda run=run, x=x: run(x))
    print(f"{a.copies} x [{a.n}, {a.k}] {a.dtype} weights, best of {a.repeats}")
    for (rows, name), secs in zip(names, best_seconds_each(calls, a.repeats)):
        flops = 2 * rows * a.k * a.n * a.copies
        print(f"rows {rows:5d}  {name:9s} {secs * 1e3:8.1f} ms  {flops / secs / 1e9:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
