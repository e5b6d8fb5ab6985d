"""Run a function on N local ranks, each its own process with torch.distributed initialised
(gloo, rendezvous over a file): how the tests, `tacit bench comm` and the engine's workers start."""

from __future__ import annotations

import os
import pickle
import tempfile
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def init_rank(rank: int, world_size: int, init_file: str, backend: str = "gloo") -> None:
    """torch.distributed for this process, rendezvous over `init_file` (no port to pick)."""
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)


def init_rank_watching(
    rank: int, world_size: int, init_file: str, check: Callable[[], None], poll_s: float = 0.02, backend: str = "gloo"
) -> None:
    """init_rank, after a rendezvous this rank can watch: every rank marks itself ready in the file
    store, then waits for the others' marks, calling check() every poll_s; only once all are
    there is the process group made.

    init_process_group's own wait (30 minutes by default) cannot be interrupted: a peer killed
    before it got there (while still importing torch, or out of memory) would hold this rank that
    long. check() raises when a process this rank waits for is gone, and that error is raised
    here at once. A first version waited in init_process_group on a helper thread instead; the
    abandoned thread, still inside gloo's connect, hung the next process group this process made."""
    store = dist.FileStore(init_file, world_size)
    store.set(f"tacit_ready_{rank}", "1")
    marks = [f"tacit_ready_{r}" for r in range(world_size)]
    while not store.check(marks):
        check()
        time.sleep(poll_s)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)


def _entry(rank: int, world_size: int, init_file: str, fn: Callable, args: tuple, results) -> None:
    try:
        init_rank(rank, world_size, init_file)
        # Every rank's mesh connected before any runs fn: a rank whose fn needs no collective
        # would otherwise return and exit while a slower peer is still in gloo's connectFullMesh,
        # which then fails with "Connection closed by peer" (seen on a loaded 2-core machine).
        dist.barrier()
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
