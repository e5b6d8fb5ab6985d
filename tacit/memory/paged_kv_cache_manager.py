"""PagedKVCacheManager: the KVCacheManager over one block table per request.

Every kind of KV cache there is keeps every token (tacit/kv_cache_interface.py), so a block id
addresses the same block in every group's layers and one table per request serves all groups:
the manager needs the groups only through the KVCacheConfig's block count and size. Under
data-parallel attention it keeps num_pools pools and places each request in one (the
scheduler's choice, or else the one with the most free blocks when it first gets blocks);
block ids are local to that pool.

With enable_caching (the prefix cache, on by default in the engine), every full block of
verified tokens is named by its hash (memory/block_hash.py) in its pool once the scheduler says
it is verified (cache_blocks); a later request whose leading blocks hash the same takes those
blocks (reference counted) instead of computing them, and a freed request's cached blocks stay
findable until the pool needs them for something else (least recently freed first, a request's
tail blocks before its head).
"""

from __future__ import annotations

from tacit.kv_cache_interface import KVCacheConfig
from tacit.memory.block_hash import BlockHash
from tacit.memory.block_pool import BlockPool
from tacit.memory.kv_cache_manager import KVCacheManager


class PagedKVCacheManager(KVCacheManager):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_pools: int = 1,
        enable_caching: bool = False,
        record_evictions: bool = False,
    ) -> None:
        """num_blocks per pool; num_pools: one per data-parallel attention rank (1 otherwise);
        enable_caching: the prefix cache; record_evictions: for a second tier (take_evicted),
        which needs the prefix cache and one pool."""
        if num_pools < 1:
            raise ValueError(f"num_pools={num_pools} is invalid: must be >= 1")
        if record_evictions and (not enable_caching or num_pools != 1):
            raise ValueError(
                f"a second KV tier needs the prefix cache on and one pool (enable_caching={enable_caching}, "
                f"num_pools={num_pools})"
            )
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pools = [BlockPool(num_blocks, record_evictions) for _ in range(num_pools)]
        self._block_ids: dict[str, list[int]] = {}
        self._pool_of: dict[str, int] = {}
        self._verified: dict[str, int] = {}
        self._num_cached: dict[str, int] = {}  # leading blocks of each request already cached

    @classmethod
    def from_kv_cache_config(
        cls, config: KVCacheConfig, enable_caching: bool = False, record_evictions: bool = False
    ) -> PagedKVCacheManager:
        """The manager of the pool the worker allocated (Executor.kv_cache_config)."""
        return cls(config.num_blocks, config.block_size, config.num_pools, enable_caching, record_evictions)

    @property
    def num_pools(self) -> int:
        return len(self.pools)

    def place(self, request_id: str, pool: int) -> None:
        if self._block_ids.get(request_id):
            raise RuntimeError(f"request {request_id} already holds blocks in pool {self._pool_of[request_id]}")
        if not 0 <= pool < len(self.pools):
            raise ValueError(f"pool {pool} does not exist: there are {len(self.pools)}")
        self._pool_of[request_id] = pool

    def pool_of(self, request_id: str) -> int:
        return self._pool_of.get(request_id, 0)

    def same_pool(self, a: str, b: str) -> bool:
        return len(self.pools) == 1 or self._pool_of.get(a) == self._pool_of.get(b)

    def _pool_for(self, request_id: str, blocks: int) -> BlockPool | None:
        placed = self._pool_of.get(request_id)
        if placed is None:
            # The emptiest pool: requests spread over the ranks as their KV grows.
            placed = max(range(len(self.pools)), key=lambda p: (self.pools[p].num_free_blocks, -p))
            if self.pools[placed].num_free_blocks < blocks:
                return None
            self._pool_of[request_id] = placed
        return self.pools[placed]

    def get_computed_blocks(
        self, request_id: str, block_hashes: list[BlockHash], num_tokens: int
    ) -> tuple[list[int], int]:
        if not self.enable_caching:
            return [], 0
        blocks = self.pools[self._pool_of.get(request_id, 0)].lookup(self.usable_prefix(block_hashes, num_tokens))
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += len(blocks) * self.block_size
        return blocks, len(blocks) * self.block_size

    def cached_prefix_blocks(self, block_hashes: list[BlockHash], num_tokens: int, pool: int) -> int:
        if not self.enable_caching:
            return 0
        return len(self.pools[pool].lookup(self.usable_prefix(block_hashes, num_tokens)))

    def allocate_slots(
        self,
        request_id: str,
        num_computed_tokens: int,
        num_new_tokens: int,
        new_computed_blocks: list[int] | None = None,
    ) -> list[int] | None:
        table = self._block_ids.setdefault(request_id, [])
        hits = new_computed_blocks or []
        if hits and table:
            raise RuntimeError(f"request {request_id} already holds blocks: a prefix hit comes before any")
        extra = self.blocks_needed(num_computed_tokens + num_new_tokens) - len(table) - len(hits)
        if extra > 0 or hits:
            pool = self._pool_for(request_id, max(extra, 0))
            # Hit blocks sitting in the free queue stop being free once taken.
            if pool is None or max(extra, 0) > pool.num_free_blocks - pool.num_free_among(hits):
                return None
        self._verified[request_id] = num_computed_tokens
        if hits:
            pool.touch(hits)
            table.extend(hits)
            self._num_cached[request_id] = len(hits)
        if extra <= 0:
            return []
        new = pool.allocate(extra)
        table.extend(new)
        return new

    def cache_blocks(self, request_id: str, block_hashes: list[BlockHash], num_verified_tokens: int) -> None:
        table = self._block_ids.get(request_id)
        if not table:
            return
        self._verified[request_id] = max(self._verified.get(request_id, 0), num_verified_tokens)
        if not self.enable_caching:
            return
        full = min(num_verified_tokens // self.block_size, len(block_hashes), len(table))
        done = self._num_cached.get(request_id, 0)
        if full <= done:
            return
        pool = self.pools[self._pool_of.get(request_id, 0)]
        for i in range(done, full):
            pool.cache(table[i], block_hashes[i])
        self._num_cached[request_id] = full

    def take_evicted(self) -> list[tuple[int, BlockHash]]:
        return [e for p in self.pools for e in p.take_evicted()]

    def cached_blocks(self) -> list[tuple[int, BlockHash]]:
        return [e for p in self.pools for e in p.cached_blocks()]

    def num_verified_tokens(self, request_id: str) -> int:
        return self._verified.get(request_id, 0)

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self._block_ids.get(request_id, ()))

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._block_ids.get(request_id, ()))

    def num_unshared_blocks(self, request_id: str) -> int:
        return self.pools[self._pool_of.get(request_id, 0)].num_unshared_among(self._block_ids.get(request_id, []))

    def free(self, request_id: str) -> None:
        pool = self._pool_of.pop(request_id, 0)
        self._verified.pop(request_id, None)
        self._num_cached.pop(request_id, None)
        table = self._block_ids.pop(request_id, [])
        # Tail first: the blocks only this request's longest prefix reaches are evicted first.
        self.pools[pool].free(reversed(table) if self.enable_caching else table)

    @property
    def num_free_blocks(self) -> int:
        return sum(p.num_free_blocks for p in self.pools)

    def num_free_blocks_in(self, pool: int) -> int:
        return self.pools[pool].num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return sum(p.num_cached_blocks for p in self.pools)

    @property
    def num_used_blocks(self) -> int:
        return sum(p.num_used_blocks for p in self.pools)

    @property
    def num_blocks(self) -> int:
        return sum(p.num_blocks for p in self.pools)

    @property
    def capacity_tokens(self) -> int:
        return self.pools[0].num_blocks * self.block_size
