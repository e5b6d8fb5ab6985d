"""Run a burst of torch work on a thread of its own, so it leaves no OpenMP pool behind.

torch's CPU build parallelises through libgomp, which keeps one pool of worker threads for each
thread that has started a parallel region, for as long as that thread lives. While the pools'
threads outnumber the cores, libgomp's workers spin only briefly before they sleep, so every
parallel region then pays a futex wake-up. A process that measures something on its main thread
(a `bench hw` probe, a calibration fit, a KLD check) and then steps an engine on another thread
(AsyncLLMEngine, as `tacit tune`'s trials and `tacit serve` do) steps it slowly for the rest of
its life: on the 2-core EPYC, a 100k-element add on a fresh thread took 15 us before the main
thread had run one parallel op and 80 us after (scratch probe, docs/performance/tune.md), and
the default model's 16-row decode step in a tune trial went from 87-102 ms to 121-133 ms after
the main thread measured this machine's peaks. A thread that ends takes its pool with it.
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
