"""Executors: how a step's SchedulerOutput reaches every rank that holds part of the model.

UniProcExecutor runs the one ModelRunner in this process. MultiProcExecutor (tensor_parallel_size
N > 1) is rank 0 itself and starts ranks 1..N-1 as worker processes (engine/worker.py), each on
its own cores; every step it sends them the plain SchedulerOutput (and the tokens it sampled in
the step before) over a pipe, then runs its own shard. The scheduler lives only here.

A worker that dies is noticed at once: its sockets close, so the collective the driver waits in
raises (gloo: "Connection closed by peer", ~1 s), and every step first checks the workers are
alive. Either way the engine raises WorkerDiedError naming the rank, pid and exit code.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from abc import ABC, abstractmethod
from typing import Callable

import torch.distributed as dist

from tacit.distributed.parallel_state import TensorParallel
from tacit.engine.arg_utils import EngineArgs
from tacit.engine.model_runner import ModelRunner
from tacit.engine.worker import StepMessage, load_rank, pin_to_cores, rank_cores, worker_main
from tacit.loader import ModelSource
from tacit.outputs import ModelRunnerOutput
from tacit.platforms import Platform
from tacit.scheduling.scheduler_output import SchedulerOutput


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process is gone; the engine cannot run another step."""


class Executor(ABC):
    runner: ModelRunner  # rank 0's: its config, KV pool size and request states are the engine's

    @abstractmethod
    def execute(
        self, scheduler_output: SchedulerOutput, between_layers: Callable[[], None] | None
    ) -> ModelRunnerOutput: ...

    def check_health(self) -> None:
        """Raise WorkerDiedError if a rank is gone."""

    def shutdown(self) -> None:
        """Stop the workers (a no-op in one process)."""


class UniProcExecutor(Executor):
    def __init__(self, engine_args: EngineArgs, source: ModelSource, platform: Platform) -> None:
        self.runner = load_rank(engine_args, source, platform, TensorParallel())

    def execute(self, scheduler_output, between_layers):
        return self.runner.execute(scheduler_output, between_layers)


class MultiProcExecutor(Executor):
    def __init__(self, engine_args: EngineArgs, source: ModelSource, platform: Platform, world_size: int) -> None:
        from tacit.distributed.spawn import init_rank

        ctx = multiprocessing.get_context("spawn")  # fork would copy this process's threads and locks
        fd, init_file = tempfile.mkstemp(prefix="tacit-tp-")
        os.close(fd)
        os.unlink(init_file)  # the file store creates it; a stale one would hold an old rendezvous
        self.procs, self.pipes = [], []
        for rank in range(1, world_size):
            recv_end, send_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_worker_entry, args=(rank, world_size, init_file, engine_args, recv_end), daemon=True
            )
            proc.start()
            recv_end.close()
            self.procs.append(proc)
            self.pipes.append(send_end)
        self._sampled: tuple[list[str], list[int]] = ([], [])
        self._closed = False
        try:
            pin_to_cores(rank_cores(0, world_size))
            init_rank(0, world_size, init_file)
            self.runner = self._collective(
                lambda: load_rank(engine_args, source, platform, TensorParallel(0, world_size))
            )
        except BaseException:
            self.shutdown()
            raise
        finally:
            if os.path.exists(init_file):
                os.unlink(init_file)

    def _dead_workers(self) -> list[str]:
        return [
            f"rank {rank} (pid {p.pid}, exit code {p.exitcode})"
            for rank, p in enumerate(self.procs, start=1)
            if not p.is_alive()
        ]

    def check_health(self) -> None:
        dead = self._dead_workers()
        if dead:
            raise WorkerDiedError(f"tensor-parallel worker {', '.join(dead)} is gone; the engine cannot continue")

    def _collective(self, fn):
        """fn() on this rank; a collective that failed because a worker died is reported as that
        (a ValueError, a bad input every rank refuses alike, stays what it is)."""
        try:
            return fn()
        except RuntimeError as e:
            for p in self.procs:  # a dying worker's sockets close a moment before its exit code is in
                p.join(timeout=2.0)
            if self._dead_workers():
                self.check_health()
            raise e

    def execute(self, scheduler_output, between_layers):
        # A cut-in (between_layers) would run a nested step on this rank alone: not under TP.
        self.check_health()
        msg = StepMessage(scheduler_output, *self._sampled)
        try:
            for pipe in self.pipes:
                pipe.send(msg)
        except (BrokenPipeError, EOFError, OSError):
            self._collective(lambda: None)
            self.check_health()
            raise
        out = self._collective(lambda: self.runner.execute(scheduler_output, None))
        self._sampled = (list(out.req_ids), list(out.sampled_token_ids))
        return out

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pipe in self.pipes:
            try:
                pipe.send(StepMessage(None, [], []))
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
        if dist.is_initialized():
            dist.destroy_process_group()


def _worker_entry(rank: int, world_size: int, init_file: str, engine_args: EngineArgs, pipe) -> None:
    worker_main(rank, world_size, init_file, engine_args, pipe)


def make_executor(engine_args: EngineArgs, source: ModelSource, platform: Platform, world_size: int) -> Executor:
    if world_size == 1:
        return UniProcExecutor(engine_args, source, platform)
    return MultiProcExecutor(engine_args, source, platform, world_size)
