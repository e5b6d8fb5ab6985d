"""Run a function on N local ranks, each its own process with torch.distributed initialised
(gloo, rendezvous over a file): how the tests, `tacit bench comm` and the engine's workers start."""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def init_rank(rank: int, world_size: int, init_file: str, backend: str = "gloo") -> None:
    """torch.distributed for this process, rendezvous over `init_file` (no port to pick)."""
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)


def _entry(rank: int, world_size: int, init_file: str, fn: Callable, args: tuple, results) -> None:
    try:
        init_rank(rank, world_size, init_file)
        # Pickled here, so tensors travel as bytes: the queue's own pickler would hand over
        # shared-memory handles that die with this process.
        results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:  # the parent reports it with this rank's traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 300.0) -> list[Any]:
    """fn(rank, world_size, *args) on `world_size` spawned processes; their return values in
    rank order. fn and its arguments must be picklable (a module-level function)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="tacit-rendezvous-")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it; a stale one would hold an old rendezvous
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, init_file, fn, args, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors = []
    try:
        for _ in range(world_size):
            rank, ok, value = results.get(timeout=timeout_s)
            if ok:
                out[rank] = pickle.loads(value)
            else:
                errors.append(f"rank {rank} failed:\n{value}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
        if os.path.exists(init_file):
            os.unlink(init_file)
    if errors:
        raise RuntimeError("\n".join(errors))
    return [out[r] for r in range(world_size)]
