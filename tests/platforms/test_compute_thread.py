"""compute_thread.run_on_own_thread: torch work on a thread that ends, so no OpenMP pool of it
outlives the work (what slowed engine threads after a main-thread probe: compute_thread.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from tacit.platforms import hardware_table
from tacit.platforms.compute_thread import run_on_own_thread


def test_it_runs_fn_on_another_thread_and_returns_its_result():
    caller = threading.get_ident()
    ident, value = run_on_own_thread(lambda x, y: (threading.get_ident(), x + y), 2, 3)
    assert value == 5 and ident != caller


def test_it_reraises_fns_exception_in_the_caller():
    def boom():
        raise ValueError("the probe failed")

    with pytest.raises(ValueError, match="the probe failed"):
        run_on_own_thread(boom)


def _threads() -> set[int]:
    return set(map(int, os.listdir("/proc/self/task")))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: a torch thread starts no OpenMP pool")
def test_the_threads_openmp_pool_ends_with_it():
    """A parallel op on a fresh thread starts a pool of torch.get_num_threads() - 1 workers for
    that thread (libgomp); once run_on_own_thread returns, the threads the work started have
    ended, so no pool of it is left to slow another thread's parallel regions. Threads are told
    apart by id, not counted: another test's thread ending meanwhile made a count read 8 where
    9 were due (CI, 47ac220), and an earlier test may leave torch at one thread, so the test
    sets two itself."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _threads()
        started: list[set[int]] = []

        def work() -> None:
            a = torch.ones(1 << 20)
            (a + a).sum()  # 1M elements: past at::parallel_for's grain, so it runs on the pool
            started.append(_threads() - before)

        run_on_own_thread(work)
    finally:
        torch.set_num_threads(threads)
    assert len(started[0]) >= 2  # the thread and its pool's worker
    deadline = time.monotonic() + 5.0
    while started[0] & _threads() and time.monotonic() < deadline:  # the workers exit as their pool is freed
        time.sleep(0.01)
    assert not started[0] & _threads()


def test_this_cpus_peaks_are_measured_now_and_off_the_callers_thread(monkeypatch):
    """Each call probes again (a validation compares them with its fit before each model), on a
    thread that is not the caller's; this_cpu_spec keeps the process's first measurement."""
    calls: list[int] = []

    def fake_matmul(dtype, n):
        calls.append(threading.get_ident())
        return 1e11 * len(calls)

    monkeypatch.setattr(hardware_table, "matmul_flops", fake_matmul)
    monkeypatch.setattr(hardware_table, "peak_read_bandwidth", lambda: 3e10 + len(calls))
    one, two = hardware_table.this_cpu_peaks(), hardware_table.this_cpu_peaks()
    assert one["bf16_flops"] == 2e11 and two["bf16_flops"] == 4e11 and one["fp32_flops"] == 1e11
    assert one["read_bandwidth"] != two["read_bandwidth"]
    assert threading.get_ident() not in calls
