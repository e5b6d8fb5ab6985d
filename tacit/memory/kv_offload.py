"""The prefix cache's second tier, the scheduler's side: which cached blocks of tokens live below
the KV pool (in host memory, or in files on local disk that outlive the process), and the copies
the runners make between the tier and the pool.

Blocks evicted from the pool (BlockPool.allocate hands a free cached block out for something
else) are stored in the tier before the step that overwrites them runs; a later request whose
prefix the pool no longer holds but the tier does has those blocks loaded into fresh pool blocks
instead of prefilling them. vLLM's KV offloading (`--kv-offloading-size`) does the same below a
GPU pool, SGLang's HiCache below its radix tree, llama.cpp's `--cache-ram` below its slots.

Two halves, as swapping (memory/swap.py) is split, so that data flows one way through a step:
  KVOffloadIndex (here): the tier's content by block hash, its capacity in blocks and its least
      recently used order. It decides; each decision is an OffloadOp, plain data that travels in
      the SchedulerOutput.
  KVOffloadStore (each runner's, worker/kv_offload_store.py): keeps the bytes and carries the ops
      out on its own KV layers before the step's forward: stores first (an evicted block may be
      this step's new block), then swap copies, then loads.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tacit.memory.block_hash import BlockHash


@dataclass(frozen=True)
class OffloadOp:
    """store: copy pool block `block_id` into the tier under `block_hash`; load: copy the tier's
    `block_hash` into pool block `block_id`; discard: forget `block_hash` (block_id unused)."""

    kind: str  # "store" | "load" | "discard"
    block_hash: BlockHash
    block_id: int = -1


class KVOffloadIndex:
    """What the tier holds, in least recently used order (stored or loaded counts as a use)."""

    def __init__(self, capacity_blocks: int, held: list[BlockHash] | tuple[BlockHash, ...] = ()) -> None:
        """held: what the tier already holds (a disk tier's files, validated by the runners),
        least recently used first."""
        if capacity_blocks < 1:
            raise ValueError(f"the KV offloading tier holds {capacity_blocks} blocks; it needs at least 1")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()
        self._ops: list[OffloadOp] = []
        self._loading: set[BlockHash] = set()  # loads in the ops not yet taken: never discarded
        # Since start: prompt tokens looked up in the tier (past what the pool held) and found
        # there (vLLM's external prefix cache counters); blocks stored and loaded.
        self.queries = self.hits = 0
        self.num_stored = self.num_loaded = 0
        for h in held[-capacity_blocks:]:
            self._lru[h] = None
        for h in held[:-capacity_blocks]:
            self._ops.append(OffloadOp("discard", h))

    @property
    def num_blocks(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._lru

    def lookup(self, hashes: list[BlockHash], num_tokens: int, block_size: int) -> int:
        """How many of these block hashes, in order from the first, the tier holds. num_tokens:
        the prompt tokens these hashes stand for, counted as looked up."""
        n = self.peek(hashes)
        self.queries += num_tokens
        self.hits += n * block_size
        return n

    def peek(self, hashes: list[BlockHash]) -> int:
        """lookup without counting it: for estimates (the SLA policy's, placement)."""
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return n

    def store(self, evicted: list[tuple[int, BlockHash]]) -> None:
        """Blocks the pool is handing out for something else, with the hashes they cached: each
        hash the tier lacks is copied down (the least recently used entries make room), each it
        has becomes its most recently used."""
        for block_id, h in evicted:
            if h in self._lru:
                self._lru.move_to_end(h)
                continue
            if len(self._lru) >= self.capacity_blocks:
                old = next((o for o in self._lru if o not in self._loading), None)
                if old is None:
                    continue  # all held blocks are being loaded this step: this one is not kept
                del self._lru[old]
                self._ops.append(OffloadOp("discard", old))
            self._lru[h] = None
            self._ops.append(OffloadOp("store", h, block_id))
            self.num_stored += 1

    def load(self, hashes: list[BlockHash], block_ids: list[int]) -> None:
        """Copy these held hashes into these (newly allocated) pool blocks before the step runs."""
        for h, block_id in zip(hashes, block_ids, strict=True):
            self._lru.move_to_end(h)
            self._loading.add(h)
            self._ops.append(OffloadOp("load", h, block_id))
            self.num_loaded += 1

    def take_ops(self) -> list[OffloadOp]:
        """The ops decided since the last call, for the next SchedulerOutput."""
        ops, self._ops = self._ops, []
        self._loading.clear()
        return ops

    def save_all(self, cached: list[tuple[int, BlockHash]]) -> None:
        """Store every block the pool caches (most valuable first) that the tier lacks, as far
        as its room goes without discarding what it holds: at shutdown, so that a disk tier
        outlives the process with the pool's content too."""
        room = self.capacity_blocks - len(self._lru)
        self.store([(b, h) for b, h in cached if h not in self._lru][:room])
