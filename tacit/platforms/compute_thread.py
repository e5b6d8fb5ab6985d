"""Run a burst of torch work on a thread of its own, so it leaves no OpenMP pool behind.

torch's CPU build parallelises through libgomp, which keeps one pool of worker threads for each
thread that has started a parallel region, for as long as that thread lives. While the pools'
threads outnumber the cores, libgomp's workers spin only briefly before they sleep, so every
parallel region then pays a futex wake-up. A process that measures something on its main thread
(a `bench hw` probe, a calibration fit, a KLD check) and then steps an engine on another thread
(AsyncLLMEngine, as `tacit tune`'s trials and `tacit serve` do) steps it slowly for the rest of
its life. On the 2-core EPYC (scripts/openmp_pool_speed.py), a 100k-element add on a fresh
thread took 11.6 us before the main thread ran one 1024^3 matmul and 72.6 us after, and the
default model's 16-request tune trial went from a 99.4 to a 130.4 ms median TPOT; with the
matmul run through run_on_own_thread, 11.7 -> 11.7 us and 93.9 -> 104.5 ms (within the shared
machine's drift). A thread that ends takes its pool with it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def run_on_own_thread(fn: Callable[..., T], *args: Any, name: str = "tacit-compute") -> T:
    """fn(*args) run on a new thread and joined: its result returned, its exception re-raised
    here. A Ctrl-C interrupts the wait on the calling (main) thread; the thread is a daemon, so
    it does not keep the process alive after that."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn(*args))
        except BaseException as e:  # handed to the caller, who decides what it means
            error.append(e)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
