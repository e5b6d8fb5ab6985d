"""A peer engine in its own process, so a peer that crashes or hangs costs only its own rows.

llama-cpp-python's native build segfaults on CPUs that advertise AMX at any multi-token batch;
run in the benchmark's process, that signal killed the whole run and printed no result at all,
tacit's included. Here the peer lives in a spawned child that answers each measurement over a
pipe: a child that dies (its exit status or signal is reported) or does not answer within the
timeout (it is killed) is marked failed, its later calls return None, and every other engine's
results stand. An exception the peer raises (a missing extra, a bad argument) is raised here as
it would be in one process.
"""

from __future__ import annotations

import importlib
import multiprocessing
import signal
from typing import Any

from tacit.bench.peers.base import BenchEngine

DEFAULT_TIMEOUT_S = 900.0  # one measurement call: generous, so only a peer that is stuck is killed


def _serve(factory: str, args: tuple, conn) -> None:
    """The child: build the peer, then answer (method, args) calls until the pipe closes."""
    module, cls = factory.split(":")
    try:
        peer = getattr(importlib.import_module(module), cls)(*args)
        conn.send((True, None))
    except Exception as e:  # sent back whole: the parent raises it as one process would
        conn.send((False, e))
        return
    while True:
        try:
            method, call_args = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, getattr(peer, method)(*call_args)))
        except Exception as e:
            conn.send((False, e))


def describe_exit(exitcode: int | None) -> str:
    """'killed by signal 11 (SIGSEGV)', 'exited with code 1', or 'still running'."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class ProcessPeer(BenchEngine):
    """`factory` ('module:Class') built with `args` in a child process; measured through it."""

    def __init__(self, name: str, factory: str, args: tuple, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.failure: str | None = None
        ctx = multiprocessing.get_context("spawn")  # fork would copy tacit's threads and locks
        self._conn, child_end = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(factory, args, child_end), daemon=True)
        self._proc.start()
        child_end.close()
        self._call("__init__")
        if self.failure is not None:
            raise RuntimeError(f"peer {name} failed while loading: {self.failure}")

    def _call(self, method: str, *args: Any) -> Any:
        if self.failure is not None:
            return None
        if method != "__init__":
            self._conn.send((method, args))
        if not self._conn.poll(self.timeout_s):
            self._proc.kill()
            self._proc.join(5.0)
            self.failure = f"no answer to {method} in {self.timeout_s:.0f} s (killed)"
            return None
        try:
            ok, value = self._conn.recv()
        except (EOFError, ConnectionResetError):  # the child is gone mid-call
            self._proc.join(5.0)
            self.failure = f"{describe_exit(self._proc.exitcode)} during {method}"
            return None
        if not ok:
            raise value
        return value

    def ask(self, method: str, *args: Any) -> Any:
        """Any other method of the peer (a check, not a measurement: llama.cpp's greedy tokens
        on a file tacit wrote); None once the peer failed, as for the measurements."""
        return self._call(method, *args)

    def latency(self, prompts: list[list[int]], output_len: int) -> dict[str, float] | None:
        return self._call("latency", prompts, output_len)

    def throughput(self, requests: list[tuple[list[int], int]]) -> dict[str, float] | None:
        return self._call("throughput", requests)

    def close(self) -> None:
        self._conn.close()
        self._proc.join(5.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5.0)
