"""BlockPool: the fixed set of KV cache blocks, which are free, and (with the prefix cache) which
free or shared blocks hold a known block of tokens.

Every block has a reference count: the requests whose tables hold it. A block no request holds is
free; with caching on, a free block may still hold a cached block of tokens, found by its hash
until the pool hands it out for something else. Free blocks form one queue in least recently
freed order: allocation takes from the front (evicting what the block cached), a request's
freed blocks join the back, and a hit on a free cached block takes it out of the queue, all
O(1) (an OrderedDict). Without caching the pool behaves as a plain FIFO free list.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from tacit.memory.block_hash import BlockHash


class BlockPool:
    def __init__(self, num_blocks: int, record_evictions: bool = False) -> None:
        """record_evictions: keep the (block, hash) of each cached block handed out for something
        else, for take_evicted (the second tier stores them before they are written over)."""
        self.num_blocks = num_blocks
        self._evicted: list[tuple[int, BlockHash]] | None = [] if record_evictions else None
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._ref = [0] * num_blocks
        self._block_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._block_of)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks with {len(self._free)} free")
        out = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            cached = self._hash_of.pop(block, None)
            if cached is not None:  # evicted: its tokens are about to be written over
                del self._block_of[cached]
                if self._evicted is not None:
                    self._evicted.append((block, cached))
            self._ref[block] = 1
            out.append(block)
        return out

    def take_evicted(self) -> list[tuple[int, BlockHash]]:
        """The (block, hash) of every cached block allocate handed out since the last call."""
        out, self._evicted = self._evicted or [], [] if self._evicted is not None else None
        return out

    def cached_blocks(self) -> list[tuple[int, BlockHash]]:
        """Every cached (block, hash): the ones requests hold, then the free ones from the most
        recently freed (the order a tier of less room should keep them in)."""
        held = [(b, h) for b, h in self._hash_of.items() if self._ref[b] > 0]
        return held + [(b, self._hash_of[b]) for b in reversed(self._free) if b in self._hash_of]

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; a block no one holds any more joins the free queue's
        back (so pass a request's blocks tail first: its last blocks are evicted first)."""
        for block in blocks:
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None

    def lookup(self, hashes: list[BlockHash]) -> list[int]:
        """The blocks holding the longest cached prefix of these block hashes."""
        out = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def num_free_among(self, blocks: list[int]) -> int:
        """How many of these (cached) blocks sit in the free queue: a hit on them takes them out."""
        return sum(self._ref[b] == 0 for b in blocks)

    def num_unshared_among(self, blocks: list[int]) -> int:
        """How many of these held blocks no one else holds: what dropping this holder frees."""
        return sum(self._ref[b] == 1 for b in blocks)

    def touch(self, blocks: list[int]) -> None:
        """A request takes a reference to cached blocks it hit."""
        for block in blocks:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Name a full block of verified tokens by its hash. A hash already cached keeps its
        block (the same tokens computed twice, e.g. by two requests prefilling at once), and a
        block caches one hash for as long as it holds it."""
        if block_hash not in self._block_of and block not in self._hash_of:
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash
