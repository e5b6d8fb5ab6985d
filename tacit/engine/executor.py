"""Executors: how a step's SchedulerOutput reaches every rank that holds part of the model.

UniProcExecutor runs the one ModelRunner in this process. MultiProcExecutor (tensor_parallel_size
N > 1) is rank 0 itself; the other ranks are worker processes (worker/rank.py) that it either
spawns on this host, each on its own cores, or finds already started by torchrun (one host or
many: `torchrun --nproc-per-node N [--nnodes --node-rank --master-addr] -m tacit.cli serve ...`,
where every rank but 0 turns into a worker inside make_executor). Every step it sends them the
plain SchedulerOutput (and the tokens it sampled in the step before) over a StepChannel, then
runs its own shard. The scheduler lives only here.

A worker that dies is noticed at once: its sockets close, so the collective the driver waits in
raises (gloo: "Connection closed by peer", ~1 s; the shared-memory communicator checks its peers'
pids every ~1 ms), and every step first checks spawned workers are alive. Either way the engine
raises WorkerDiedError naming the rank. At start-up rank 0 watches its workers while it waits in
the rendezvous (distributed/spawn.py: init_rank_watching), so a worker killed before it got
there (while importing torch, or out of memory) is reported the same way at once, not
after the rendezvous' 30-minute timeout; a spawned worker likewise leaves the rendezvous when
its driver exits.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from abc import ABC, abstractmethod

import torch
import torch.distributed as dist

from tacit.config import EngineConfig
from tacit.distributed.parallel_state import TensorParallel
from tacit.kv_cache_interface import KVCacheConfig
from tacit.loader import ModelSource
from tacit.outputs import ModelRunnerOutput
from tacit.platforms import Platform
from tacit.scheduling.scheduler_output import SchedulerOutput
from tacit.worker.model_runner import ModelRunner
from tacit.worker.paths.base import Steps
from tacit.worker.rank import load_rank, pin_to_cores, rank_cores, spawned_worker, torchrun_rank, worker_main
from tacit.worker.step_channel import COLLECT_STATS, STOP, BroadcastChannel, PipeChannel, StepMessage

# What a collective raises when a peer process is gone (gloo's socket errors, the shm
# communicator's pid check): under torchrun there is no process handle to ask.
_PEER_GONE = ("closed by peer", "reset by peer", "exited", "Broken pipe")


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process is gone; the engine cannot run another step."""


class Executor(ABC):
    runner: ModelRunner  # rank 0's: its model and request states
    # The workers' answer to the KV handshake: the pool every rank allocated (the same on every
    # rank: worker/rank.py agree_kv_cache_config), all the engine knows of it.
    kv_cache_config: KVCacheConfig

    @abstractmethod
    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    def execute_steps(self, scheduler_output: SchedulerOutput) -> Steps[ModelRunnerOutput]:
        """The step, pausing at decoder-layer boundaries where this executor can (one process:
        the caller may run a cut-in step there). Here: a step that never pauses."""
        return self.execute(scheduler_output)
        yield

    def shutdown(self) -> None:
        """Stop the workers (a no-op in one process)."""

    def rank_stats(self) -> list[dict[str, float]]:
        """Every rank's ModelRunner.rank_stats(), in rank order."""
        return [self.runner.rank_stats()]


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig, source: ModelSource, platform: Platform) -> None:
        if config.parallel.threads is not None:  # --threads: the process's, as llama.cpp's (unset: torch's own)
            torch.set_num_threads(config.parallel.threads)
        self.runner = load_rank(config, source, platform, TensorParallel())
        self.kv_cache_config = self.runner.kv_cache_config

    def execute(self, scheduler_output):
        return self.runner.execute(scheduler_output)

    def execute_steps(self, scheduler_output):
        return self.runner.execute_steps(scheduler_output, pausable=True)


class MultiProcExecutor(Executor):
    def __init__(self, config: EngineConfig, device: str, source: ModelSource, platform: Platform) -> None:
        """config: the engine's, sent as it is to every rank; device: the device asked for
        (each worker opens its own platform with it)."""
        world_size = config.parallel.tensor_parallel_size
        self.procs: list[multiprocessing.Process] = []
        self.channel: PipeChannel | BroadcastChannel | None = None
        self._sampled: tuple[list[str], list[int]] = ([], [])
        self._closed = False
        self._init_file: str | None = None
        self.world_size = world_size
        if dist.is_initialized():
            # torch.distributed has one default process group a process, and every collective
            # here runs on it: a second engine would fail in torch with "trying to initialize
            # the default process group twice". Refused before anything starts.
            raise RuntimeError(
                "a tensor-parallel engine already runs in this process (torch.distributed's process group is "
                "initialised); call llm.shutdown() on it (or drop its last reference) before building another"
            )
        launched = torchrun_rank()
        # Rank 0's device, and the refusal of too few devices before any worker starts.
        platform.bind_local_rank(*((0, world_size) if launched is None else launched[2:]))
        try:
            if launched is None:
                self._spawn_workers(config, device, world_size)
            else:
                _, _, local_rank, local_world = launched
                pin_to_cores(rank_cores(local_rank, local_world), config.parallel.threads)
                dist.init_process_group("gloo", init_method="env://")
                self.channel = BroadcastChannel()
            parallel = config.parallel
            tp = TensorParallel(0, world_size, parallel.expert_parallel, parallel.data_parallel_attention)
            self.runner = self._collective(lambda: load_rank(config, source, platform, tp))
            self.kv_cache_config = self.runner.kv_cache_config
        except BaseException:
            self.shutdown()
            raise

    def _spawn_workers(self, config: EngineConfig, device: str, world_size: int) -> None:
        from tacit.distributed.spawn import init_rank_watching

        ctx = multiprocessing.get_context("spawn")  # fork would copy this process's threads and locks
        fd, init_file = tempfile.mkstemp(prefix="tacit-tp-")
        os.close(fd)
        os.unlink(init_file)  # the file store creates it; a stale one would hold an old rendezvous
        # Removed at shutdown, not once this rank's init returns: rank 0 can finish while a
        # worker still reads the store (the peers' gloo addresses), and a worker that then reopens
        # the path finds a new empty store and waits forever (two CI runs hung so).
        self._init_file = init_file
        pipes = []
        for rank in range(1, world_size):
            recv_end, send_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=spawned_worker, args=(rank, world_size, init_file, config, device, recv_end), daemon=True
            )
            proc.start()
            recv_end.close()
            self.procs.append(proc)
            pipes.append(send_end)
        self.channel = PipeChannel(pipes)
        pin_to_cores(rank_cores(0, world_size), config.parallel.threads)
        # A worker killed before it reaches the rendezvous is reported, not waited for.
        init_rank_watching(0, world_size, init_file, self.check_health)

    def _dead_workers(self) -> list[str]:
        return [
            f"rank {rank} (pid {p.pid}, exit code {p.exitcode})"
            for rank, p in enumerate(self.procs, start=1)
            if not p.is_alive()
        ]

    def check_health(self) -> None:
        """Raise WorkerDiedError if a spawned worker is gone."""
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
            self.check_health()
            if not self.procs and any(s in str(e) for s in _PEER_GONE):
                raise WorkerDiedError(f"a tensor-parallel rank is gone: {e}") from e
            raise

    def execute(self, scheduler_output):
        # Its steps never pause (the base execute_steps): a cut-in step run in a pause would
        # have to reach every rank mid-forward, between their collectives.
        self.check_health()
        msg = StepMessage(scheduler_output, *self._sampled)
        self._collective(lambda: self._send(msg))
        out = self._collective(lambda: self.runner.execute(scheduler_output))
        self._sampled = (list(out.req_ids), list(out.sampled_token_ids))
        return out

    def rank_stats(self) -> list[dict[str, float]]:
        self.check_health()
        self._collective(lambda: self._send(COLLECT_STATS))
        out: list = [None] * self.world_size
        self._collective(lambda: dist.gather_object(self.runner.rank_stats(), out, dst=0))
        return out

    def _send(self, msg: StepMessage) -> None:
        try:
            self.channel.send(msg)
        except (BrokenPipeError, EOFError, OSError) as e:  # a spawned worker's pipe end is gone
            raise RuntimeError(f"Broken pipe to a worker: {e}") from e

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.channel is not None:
            try:
                self.channel.send(STOP)
            except (OSError, RuntimeError):
                pass
        formed = dist.is_initialized()
        for p in self.procs:
            # Before the process group formed a worker never reads the channel: no STOP to wait for.
            p.join(timeout=5.0 if formed else 0.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        if dist.is_initialized():
            dist.destroy_process_group()
        if self._init_file is not None and os.path.exists(self._init_file):
            os.unlink(self._init_file)


def make_executor(config: EngineConfig, device: str, source: ModelSource, platform: Platform) -> Executor:
    """The executor for config's tensor_parallel_size ranks. Under torchrun every process calls this: rank 0 gets
    the executor, every other rank becomes a worker here and exits (SystemExit(0)) once the
    driver stops, so `torchrun ... -m tacit.cli serve|generate|bench ...` and a script calling
    LLM(...) run unchanged on every rank."""
    world_size = config.parallel.tensor_parallel_size
    launched = torchrun_rank()
    if launched is not None:
        rank, world, local_rank, local_world = launched
        if world != world_size:
            raise ValueError(
                f"tensor_parallel_size={world_size} but torchrun started {world} processes (WORLD_SIZE); they must match"
            )
        if rank > 0:
            pin_to_cores(rank_cores(local_rank, local_world), config.parallel.threads)
            dist.init_process_group("gloo", init_method="env://")
            worker_main(rank, world, config, device, BroadcastChannel(), (local_rank, local_world))
            raise SystemExit(0)
    if world_size == 1:
        return UniProcExecutor(config, source, platform)
    return MultiProcExecutor(config, device, source, platform)
