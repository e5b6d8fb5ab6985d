"""One tensor-parallel rank: its cores, its shard of the model and its ModelRunner.

The driver (rank 0, inside LLMEngine) and every worker process build their rank the same way
(load_rank); a worker then runs worker_main's loop: each step's plain SchedulerOutput arrives
from the driver with the tokens the driver sampled last step, and the worker runs the same
forward (joining its collectives) without sampling.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from tacit.config import EngineConfig
from tacit.distributed.communicator import Communicator
from tacit.distributed.communicators import COMMUNICATORS
from tacit.distributed.parallel_state import TensorParallel
from tacit.kv_cache_interface import KVCacheConfig
from tacit.loader import ModelSource, open_model
from tacit.memory.kv_offload import OffloadOp
from tacit.models.build import build_model
from tacit.platforms import Platform, get_platform
from tacit.worker.drafter import DraftTarget
from tacit.worker.kv_offload_store import KVOffloadId
from tacit.worker.model_fingerprint import model_fingerprint
from tacit.worker.model_runner import ModelRunner
from tacit.worker.speculative import build_drafter, drafter_class
from tacit.worker.step_channel import BroadcastChannel, PipeChannel


def rank_cores(rank: int, world_size: int) -> list[int]:
    """This rank's share of the cores the process may run on: disjoint, equal, in order."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // world_size)
    mine = cores[rank * per : (rank + 1) * per]
    return mine or [cores[rank % len(cores)]]


def pin_to_cores(cores: list[int], threads: int | None = None) -> None:
    """Run this process's threads (torch's and the C++ kernels' OpenMP) on `cores` only: ranks
    sharing a core would each wait for the other's time slice at every all-reduce. threads: how
    many (--threads), else one per core."""
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads or len(cores))


def agree_num_blocks(num_blocks: int) -> int:
    t = torch.tensor([num_blocks], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def agree_kv_cache_config(config: KVCacheConfig) -> KVCacheConfig:
    """This rank's KV cache configuration, checked equal to every other rank's (a collective):
    the scheduler's block ids and block tables index every rank's pool alike, so ranks whose
    layers declared other specs, or whose pools differ, would read each other's KV wrong."""
    configs: list = [None] * dist.get_world_size()
    dist.all_gather_object(configs, config)
    differ = [rank for rank, other in enumerate(configs) if other != config]
    if differ:
        raise RuntimeError(
            f"tensor-parallel rank {dist.get_rank()}'s KV cache configuration {config} differs from rank(s) "
            f"{differ}'s: {[configs[r] for r in differ]}"
        )
    return config


def make_communicator(platform: Platform, name: str = "auto") -> Communicator:
    """The tensor-parallel group's communicator, by its registered name (communicator=shm|torch),
    or with "auto" the platform's default (shared memory on CPU, torch.distributed's NCCL group
    on an accelerator); "auto" falls back to torch.distributed where the default cannot be built
    (the shm module did not compile, /dev/shm too small), a name asked for does not. Every rank
    calls it (a new group is collective)."""
    choice = platform.default_communicator if name == "auto" else name
    cls = COMMUNICATORS.lookup(choice)
    try:
        return cls.create(platform.communicator_backend)
    except RuntimeError as e:
        if name != "auto" or choice == "torch":
            raise
        print(f"tacit: {e}; tensor parallelism falls back to torch.distributed", file=sys.stderr)
        return COMMUNICATORS.lookup("torch").create(platform.communicator_backend)


def load_rank(config: EngineConfig, source: ModelSource, platform: Platform, tp: TensorParallel) -> ModelRunner:
    """This rank's model shard, bound to a runner whose KV pool (its KVCacheConfig) is the same on every rank.
    config: the engine's, resolved once by the driver and sent to every rank as it is."""
    device = platform.device()
    model = build_model(
        config.model, source.weights, device, platform.free_memory_bytes(), source.quantized_weights, tp
    )
    spec = config.speculative
    if tp.rank == 0 and spec is not None:  # a proposer's layers that write the target's pool join it first
        layers = drafter_class(spec).pool_layers(spec, config.model, source, device, platform.free_memory_bytes())
        if layers is not None:
            model.draft_layers = layers
    comm = make_communicator(platform, config.parallel.communicator) if tp.size > 1 else None
    agree = agree_num_blocks if tp.size > 1 else None
    offload_id = None
    if config.cache.kv_offloading_size:
        offload_id = KVOffloadId(model_fingerprint(source, config, device.type), tp.rank, tp.size)
    runner = ModelRunner(config, model, device, platform.free_memory_bytes(), comm, agree, offload_id)
    if tp.rank == 0:  # the rank that samples proposes the drafts (a draft model runs in its process)
        runner.drafter = build_drafter(spec, DraftTarget(runner, source, platform))
    if tp.size > 1:  # the handshake: the engine keeps rank 0's, the same as every rank's
        if runner.kv_offload_store is not None:
            runner.kv_cache_config = agree_offloaded_blocks(runner)
        agree_kv_cache_config(runner.kv_cache_config)
    return runner


def agree_offloaded_blocks(runner: ModelRunner) -> KVCacheConfig:
    """A block is in the tier only if every rank holds its shard (one rank's file may have been
    dropped as corrupt): the blocks all ranks hold, in rank 0's order, each rank discarding the
    others (a collective)."""
    held = list(runner.kv_cache_config.offloaded_block_hashes)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, held)
    common = set.intersection(*(set(h) for h in every))
    runner.kv_offload_store.apply_stores([OffloadOp("discard", h) for h in held if h not in common])
    return dataclasses.replace(runner.kv_cache_config, offloaded_block_hashes=tuple(h for h in every[0] if h in common))


def torchrun_rank() -> tuple[int, int, int, int] | None:
    """(rank, world size, local rank, local world size) when torchrun (or any env:// launcher)
    started this process, else None."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    world = int(env["WORLD_SIZE"])
    return int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])), int(env.get("LOCAL_WORLD_SIZE", world))


def worker_main(
    rank: int,
    world_size: int,
    config: EngineConfig,
    device: str,
    channel: PipeChannel | BroadcastChannel,
    local: tuple[int, int] | None = None,
) -> None:
    """A worker's life once it joined the group: load its shard, then run steps until told to
    stop (or the driver is gone). local: (local rank, ranks on this host), default (rank,
    world_size): which of this host's devices is its own."""
    try:
        platform = get_platform(device)
        platform.bind_local_rank(*(local or (rank, world_size)))
        parallel = config.parallel
        tp = TensorParallel(rank, world_size, parallel.expert_parallel, parallel.data_parallel_attention)
        runner = load_rank(config, open_model(config.model.path, config.model.tokenizer), platform, tp)
        while True:
            msg = channel.recv()
            if msg.collect_stats:
                dist.gather_object(runner.rank_stats(), None, dst=0)
                continue
            if msg.scheduler_output is None:
                break
            runner.append_sampled(msg.sampled_req_ids, msg.sampled_token_ids)
            runner.execute(msg.scheduler_output, sample=False)
        runner.close()
    except Exception as e:  # the driver sees the process end; say why here
        print(f"tacit: tensor-parallel worker rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawned_worker(
    rank: int, world_size: int, init_file: str, config: EngineConfig, device: str, pipe: Connection
) -> None:
    """The entry of a worker process the driver spawned on this host."""
    from tacit.distributed.spawn import init_rank_watching

    driver = multiprocessing.parent_process()  # its sentinel closes when the driver exits

    def driver_alive() -> None:
        if driver is not None and not driver.is_alive():
            raise RuntimeError(
                f"tensor-parallel rank {rank}: the driver (pid {driver.pid}) exited before the rendezvous completed"
            )

    pin_to_cores(rank_cores(rank, world_size), config.parallel.threads)
    init_rank_watching(rank, world_size, init_file, driver_alive)
    worker_main(rank, world_size, config, device, PipeChannel([pipe]))
