"""What a main-thread OpenMP pool costs an engine thread (tacit/platforms/compute_thread.py).

Each case runs in a fresh process: a 100k-element torch.add timed 2,000 times (best of 7) on a
new thread, before and after a 1024x1024 matmul that runs either on the main thread (the pool it
starts outlives it) or through run_on_own_thread (the pool ends with its thread), and, as a
control, with nothing in between. Then the default model's 16-row decode step in a tune trial
(tacit.tune.measure: 16 prompts of 64 tokens at once, 48 out; median TPOT), before and after
the same matmul, on the main thread or its own (--trial; ~1 minute each).

Run: python scripts/openmp_pool_speed.py [--trial]
"""

import argparse
import statistics
import subprocess
import sys
import threading
import time

CASES = ("nothing", "main thread", "own thread")


def _per_op_us() -> float:
    import torch

    a, b = torch.randn(100_000), torch.randn(100_000)
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(2000):
            torch.add(a, b)
        best = min(best, time.perf_counter() - t)
    return best / 2000 * 1e6


def _on_new_thread(fn):
    out = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join()
    return out[0]


def _trial_tpot_ms() -> float:
    from tacit.bench.workload_file import WorkloadRequest
    from tacit.config.engine_args import EngineArgs
    from tacit.loader.default_model import resolve_default_model
    from tacit.tune.measure import measure

    r = measure(EngineArgs(model=str(resolve_default_model())), [WorkloadRequest(0.0, 64, 48, 0)] * 16)
    return statistics.median(1e3 * (o.e2e - o.ttft) / (o.output_tokens - 1) for o in r.outcomes)


def _between(case: str) -> None:
    import torch

    from tacit.platforms.compute_thread import run_on_own_thread

    def matmul() -> None:
        a = torch.randn(1024, 1024)
        a @ a

    if case == "main thread":
        matmul()
    elif case == "own thread":
        run_on_own_thread(matmul)


def child(case: str, trial: bool) -> None:
    measure = _trial_tpot_ms if trial else (lambda: _on_new_thread(_per_op_us))
    before = measure()
    _between(case)
    after = measure()
    print(f"{before:.1f} {after:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trial", action="store_true", help="a tune trial's decode step instead of a torch.add")
    ap.add_argument("--child", choices=CASES)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.trial)
    unit = (
        "median TPOT of a 16-request tune trial, ms" if args.trial else "torch.add of 100k floats on a new thread, us"
    )
    print(f"{'matmul in between':<20} {'before':>8} {'after':>8}   ({unit})")
    for case in CASES:
        cmd = [sys.executable, __file__, "--child", case] + (["--trial"] if args.trial else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
        print(f"{case:<20} {out[-2]:>8} {out[-1]:>8}")


if __name__ == "__main__":
    main()
