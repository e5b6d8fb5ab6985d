"""`tacit bench comm`: the shared-memory communicator against gloo (TorchCommunicator) on local
ranks, per collective and tensor size, timed alternately in the same processes."""

from __future__ import annotations

import statistics
import time

import torch

from tacit.config import sizes

UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
COLLECTIVES = ("all_reduce", "all_gather", "all_to_all", "reduce_scatter")
# The targets for the all-reduce.
SPEEDUP_TARGET, SPEEDUP_FROM, SPEEDUP_TO = 8.0, 64 << 10, 32 << 20
LATENCY_TARGET_US, LATENCY_AT = 20.0, 16 << 10


def parse_size(text: str) -> int:
    """'16KB' -> 16384 (binary units, as every size flag reads them: config/sizes.py), '512' -> 512."""
    return round(sizes.parse_size(text))


def format_size(n: int) -> str:
    for unit in ("GB", "MB", "KB"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return f"{n}B"


def iterations(size: int) -> int:
    """Iterations per timed repeat: ~16 MB moved, at least 3, at most 500 (one repeat of a
    16 KB gloo all-reduce then takes ~50 ms: long next to the clock, short next to the run)."""
    return max(3, min(500, (16 << 20) // max(size, 1)))


def _op(comm, collective: str, x: torch.Tensor, world: int):
    if collective == "all_reduce":
        return lambda: comm.all_reduce(x)
    if collective == "all_gather":
        return lambda: comm.all_gather(x)
    if collective == "reduce_scatter":
        return lambda: comm.reduce_scatter(x)
    splits = [x.shape[0] // world] * world
    return lambda: comm.all_to_all(x, splits, splits)


def _time(barrier, fn, iters: int) -> float:
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def measure_rank(
    rank: int, world: int, sizes: list[int], dtype_name: str, collectives: list[str], repeats: int
) -> list[dict]:
    """On each rank (run_on_ranks): per collective and size, the median over `repeats` of each
    communicator's mean time per call, gloo and shm alternating (which goes first alternates too)."""
    from tacit.distributed.shm_communicator import ShmCommunicator
    from tacit.distributed.torch_communicator import TorchCommunicator

    torch.set_num_threads(1)  # one core per rank: the decode step's case
    dtype = DTYPES[dtype_name]
    gloo, shm = TorchCommunicator(), ShmCommunicator()
    barrier = gloo.barrier
    rows = []
    for collective in collectives:
        for size in sizes:
            rows_per_rank = max(world, size // dtype.itemsize // 64 // world * world)
            # Zeros: the time does not depend on the values, and thousands of in-place sums stay finite.
            x = torch.zeros(rows_per_rank, max(1, size // dtype.itemsize // rows_per_rank), dtype=dtype)
            ops = {"gloo": _op(gloo, collective, x, world), "shm": _op(shm, collective, x, world)}
            iters = iterations(size)
            for name in ops:  # warm-up: first-call allocations, page faults, the thread pool
                _time(barrier, ops[name], max(2, iters // 10))
            times: dict[str, list[float]] = {"gloo": [], "shm": []}
            for r in range(repeats):
                order = ["gloo", "shm"] if r % 2 == 0 else ["shm", "gloo"]
                for name in order:
                    times[name].append(_time(barrier, ops[name], iters))
            rows.append(
                {
                    "collective": collective,
                    "size": format_size(x.numel() * x.element_size()),
                    "bytes": x.numel() * x.element_size(),
                    "gloo_us": statistics.median(times["gloo"]),
                    "shm_us": statistics.median(times["shm"]),
                }
            )
    shm.close()
    return rows


def run(world: int, sizes: list[int], dtype_name: str, collectives: list[str], repeats: int) -> list[dict]:
    """Rows of collective, size, gloo_us, shm_us, speedup: each time the slowest rank's."""
    from tacit.distributed.spawn import run_on_ranks

    per_rank = run_on_ranks(measure_rank, world, sizes, dtype_name, collectives, repeats)
    rows = []
    for cells in zip(*per_rank):
        row = dict(cells[0])
        row["gloo_us"] = max(c["gloo_us"] for c in cells)
        row["shm_us"] = max(c["shm_us"] for c in cells)
        row["speedup"] = row["gloo_us"] / row["shm_us"]
        rows.append(row)
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    """The issue's two all-reduce targets, each PASS/FAIL with its numbers (or not measured)."""
    ar = [r for r in rows if r["collective"] == "all_reduce"]
    lines = []
    span = [r for r in ar if SPEEDUP_FROM <= r["bytes"] <= SPEEDUP_TO]
    if span:
        worst = min(span, key=lambda r: r["speedup"])
        ok = worst["speedup"] >= SPEEDUP_TARGET
        lines.append(
            f"{'PASS' if ok else 'FAIL'}: all_reduce >= {SPEEDUP_TARGET:g}x gloo from 64KB to 32MB "
            f"(lowest {worst['speedup']:.1f}x at {worst['size']}, over {len(span)} sizes)"
        )
    else:
        lines.append("not measured: all_reduce >= 8x gloo from 64KB to 32MB (no size in that range)")
    at = [r for r in ar if r["bytes"] == LATENCY_AT]
    if at:
        ok = at[0]["shm_us"] <= LATENCY_TARGET_US
        lines.append(
            f"{'PASS' if ok else 'FAIL'}: all_reduce <= {LATENCY_TARGET_US:g} us at 16KB ({at[0]['shm_us']:.1f} us)"
        )
    else:
        lines.append("not measured: all_reduce <= 20 us at 16KB (16KB not among the sizes)")
    return lines
