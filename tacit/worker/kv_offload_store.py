"""A model runner's side of the prefix cache's second tier (memory/kv_offload.py has the
scheduler's side and the why): the bytes of offloaded blocks of its KV layers, kept in host
memory (below a device pool) or in files on local disk (below a host-memory pool, and across
restarts), and the copies the step's OffloadOps ask for, made before its forward.

Copies out are batched: one index_select per layer for all the step's stores, not one per block
and layer (the swap path's measured 1.3-2.1 GB/s is what many small copies get). The disk tier
writes its files on one background thread, in order, so a step waits only for the copy out of
the pool; a load of a block still being written takes the copy held for the write.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from tacit.config import CacheConfig
from tacit.layers.kv_cache import KVCacheLayer
from tacit.memory.kv_offload import OffloadOp
from tacit.worker import kv_offload_disk

logger = logging.getLogger("tacit.kv_offload")


class KVOffloadStore(ABC):
    def __init__(self, layers: list[KVCacheLayer]) -> None:
        odd = [type(m).__name__ for m in layers if not isinstance(m, KVCacheLayer)]
        if odd:
            raise TypeError(
                f"a KV offloading store copies KVCacheLayer caches; {', '.join(odd)} does not declare the interface"
            )
        self.layers = layers
        self.dims = [m.kv_block_dim for m in layers]
        self.num_stored = self.num_loaded = 0
        self.seconds = 0.0

    def _copy_out(self, block_ids: list[int]) -> list[list[torch.Tensor]]:
        """[per block: [per layer: its slice, on the host]]."""
        if not block_ids:
            return []
        per_layer = []
        for m, d in zip(self.layers, self.dims):
            idx = torch.tensor(block_ids, device=m.kv_cache.device)
            per_layer.append(m.kv_cache.index_select(d, idx).to("cpu").unbind(d))
        return [[layer[i] for layer in per_layer] for i in range(len(block_ids))]

    def block_layout(self) -> list[list]:
        """What one block's per-layer slices look like (dtype, shape)."""
        return kv_offload_disk.layout_of([m.kv_cache.select(d, 0) for m, d in zip(self.layers, self.dims)])

    def apply_stores(self, ops: list[OffloadOp]) -> None:
        """The step's stores and discards, in order (before its swap copies and forward)."""
        t0 = time.perf_counter()
        stores = [op for op in ops if op.kind == "store"]
        copies = dict(zip((op.block_hash for op in stores), self._copy_out([op.block_id for op in stores])))
        for op in ops:
            if op.kind == "store":
                self._put(op.block_hash, copies[op.block_hash])
                self.num_stored += 1
            elif op.kind == "discard":
                self._drop(op.block_hash)
            elif op.kind != "load":
                raise ValueError(f"unknown offload op {op.kind!r}; valid: store, load, discard")
        self.seconds += time.perf_counter() - t0

    def apply_loads(self, ops: list[OffloadOp]) -> None:
        """The step's loads into its new blocks (after its stores and swap copies)."""
        t0 = time.perf_counter()
        for op in ops:
            if op.kind != "load":
                continue
            saved = self._get(op.block_hash)
            for m, d, host in zip(self.layers, self.dims, saved):
                m.kv_cache.select(d, op.block_id).copy_(host)
            self.num_loaded += 1
        self.seconds += time.perf_counter() - t0

    @abstractmethod
    def held(self) -> list[bytes]:
        """The block hashes this store holds, least recently used first (at start: what a disk
        tier found valid)."""

    @abstractmethod
    def _put(self, block_hash: bytes, tensors: list[torch.Tensor]) -> None: ...

    @abstractmethod
    def _get(self, block_hash: bytes) -> list[torch.Tensor]: ...

    @abstractmethod
    def _drop(self, block_hash: bytes) -> None: ...

    def close(self) -> None:
        """Finish what is in flight (a disk tier's writes)."""


class HostKVOffloadStore(KVOffloadStore):
    """Offloaded blocks in host memory: below a device's pool (pinned there, for fast copies)."""

    def __init__(self, layers: list[KVCacheLayer]) -> None:
        super().__init__(layers)
        self._pin = any(m.kv_cache.device.type != "cpu" for m in layers)
        self._blocks: dict[bytes, list[torch.Tensor]] = {}

    def held(self) -> list[bytes]:
        return list(self._blocks)

    def _put(self, block_hash: bytes, tensors: list[torch.Tensor]) -> None:
        # A copy of its own: unbind's slices would keep the whole step's copy alive as long as any
        # is held. Pinned below a device's pool: copies back from pinned memory run at full speed.
        self._blocks[block_hash] = [torch.empty_like(t, pin_memory=self._pin).copy_(t) for t in tensors]

    def _get(self, block_hash: bytes) -> list[torch.Tensor]:
        return self._blocks[block_hash]

    def _drop(self, block_hash: bytes) -> None:
        self._blocks.pop(block_hash, None)


_KEPT: Future = Future()  # the "write" of a block kept in memory after its write failed: never done
_KEPT.set_running_or_notify_cancel()


class DiskKVOffloadStore(KVOffloadStore):
    """Offloaded blocks in files (worker/kv_offload_disk.py), written on one background thread."""

    def __init__(self, layers: list[KVCacheLayer], root: str | Path, fingerprint: str, rank: int, world: int) -> None:
        super().__init__(layers)
        self.fingerprint = fingerprint
        self.directory = kv_offload_disk.entry_dir(root, fingerprint, rank, world)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"kv_offloading_dir={str(root)!r} cannot hold the KV tier: {e}") from None
        self.layout = self.block_layout()
        self._held = kv_offload_disk.scan(self.directory, fingerprint, self.layout)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tacit-kv-offload")
        # Written or being written: the copy a load takes until the file is on disk.
        self._pending: dict[bytes, tuple[list[torch.Tensor], Future]] = {}
        self._write_failed = False

    def held(self) -> list[bytes]:
        return list(self._held)

    def _path(self, block_hash: bytes) -> Path:
        return self.directory / (block_hash.hex() + ".kv")

    def _prune(self) -> None:
        """Forget the copies of blocks now on disk. A write that failed (a full disk) keeps its
        block's copy in memory, so that the tier still holds what the scheduler's index says it
        does, and says so once."""
        for h in [h for h, (_, f) in self._pending.items() if f.done()]:
            tensors, f = self._pending[h]
            error = f.exception()
            if error is None:
                del self._pending[h]
                continue
            if not self._write_failed:
                logger.warning(
                    "KV offloading: writing to %s failed (%s); blocks that cannot be written stay in host memory",
                    self.directory,
                    error,
                )
                self._write_failed = True
            self._pending[h] = (tensors, _KEPT)

    def _put(self, block_hash: bytes, tensors: list[torch.Tensor]) -> None:
        self._prune()
        tensors = [t.clone() for t in tensors]
        fut = self._writer.submit(kv_offload_disk.write_block, self.directory, self.fingerprint, block_hash, tensors)
        self._pending[block_hash] = (tensors, fut)

    def _get(self, block_hash: bytes) -> list[torch.Tensor]:
        pending = self._pending.get(block_hash)
        if pending is not None:
            return pending[0]
        path = self._path(block_hash)
        try:
            return kv_offload_disk.read_block(path, self.fingerprint, self.layout)
        except (kv_offload_disk.CorruptEntry, OSError) as e:
            raise RuntimeError(
                f"KV offloading: {path} was checked at start and changed since ({e}); the tier's directory "
                f"must not be modified while the engine runs"
            ) from None

    def _drop(self, block_hash: bytes) -> None:
        self._pending.pop(block_hash, None)
        # On the writer thread: after any write of the same block still queued.
        self._writer.submit(self._path(block_hash).unlink, missing_ok=True)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._prune()


@dataclass(frozen=True)
class KVOffloadId:
    """Who a rank is to the second tier: the model's fingerprint (worker/model_fingerprint.py)
    and its tensor-parallel place (each rank keeps its own shard of every block)."""

    fingerprint: str
    rank: int = 0
    world: int = 1


def make_kv_offload_store(cache: CacheConfig, layers: list[KVCacheLayer], who: KVOffloadId) -> KVOffloadStore | None:
    """The store cache's kv_offloading_* knobs ask for (None when the size is 0)."""
    if not cache.kv_offloading_size:
        return None
    if cache.kv_offloading_dir is None:
        return HostKVOffloadStore(layers)
    return DiskKVOffloadStore(layers, cache.kv_offloading_dir, who.fingerprint, who.rank, who.world)
