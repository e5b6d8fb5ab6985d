"""PagedKVCacheManager: the KVCacheManager over one block table per request.

Every kind of KV cache there is keeps every token (tacit/kv_cache_interface.py), so a block id
addresses the same block in every group's layers and one table per request serves all groups:
the manager needs the groups only through the KVCacheConfig's block count and size. Under
data-parallel attention it keeps num_pools pools and places each request in one (the
scheduler's choice, or else the one with the most free blocks when it first gets blocks);
block ids are local to that pool. No prefix cache yet: get_computed_blocks answers none.
"""

from __future__ import annotations

from tacit.kv_cache_interface import KVCacheConfig
from tacit.memory.block_pool import BlockPool
from tacit.memory.kv_cache_manager import KVCacheManager


class PagedKVCacheManager(KVCacheManager):
    def __init__(self, num_blocks: int, block_size: int, num_pools: int = 1) -> None:
        """num_blocks per pool; num_pools: one per data-parallel attention rank (1 otherwise)."""
        if num_pools < 1:
            raise ValueError(f"num_pools={num_pools} is invalid: must be >= 1")
        self.block_size = block_size
        self.pools = [BlockPool(num_blocks) for _ in range(num_pools)]
        self._block_ids: dict[str, list[int]] = {}
        self._pool_of: dict[str, int] = {}
        self._verified: dict[str, int] = {}

    @classmethod
    def from_kv_cache_config(cls, config: KVCacheConfig) -> PagedKVCacheManager:
        """The manager of the pool the worker allocated (Executor.kv_cache_config)."""
        return cls(config.num_blocks, config.block_size, config.num_pools)

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

    def get_computed_blocks(self, request_id: str) -> tuple[list[int], int]:
        """Without a prefix cache nothing is shared, so a new request starts from zero."""
        return [], 0

    def allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> list[int] | None:
        table = self._block_ids.setdefault(request_id, [])
        extra = self.blocks_needed(num_computed_tokens + num_new_tokens) - len(table)
        if extra > 0:
            pool = self._pool_for(request_id, extra)
            if pool is None or extra > pool.num_free_blocks:
                return None
        self._verified[request_id] = num_computed_tokens
        if extra <= 0:
            return []
        new = pool.allocate(extra)
        table.extend(new)
        return new

    def num_verified_tokens(self, request_id: str) -> int:
        return self._verified.get(request_id, 0)

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self._block_ids.get(request_id, ()))

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._block_ids.get(request_id, ()))

    def free(self, request_id: str) -> None:
        pool = self._pool_of.pop(request_id, 0)
        self._verified.pop(request_id, None)
        self.pools[pool].free(self._block_ids.pop(request_id, []))

    @property
    def num_free_blocks(self) -> int:
        return sum(p.num_free_blocks for p in self.pools)

    def num_free_blocks_in(self, pool: int) -> int:
        return self.pools[pool].num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return sum(p.num_used_blocks for p in self.pools)

    @property
    def num_blocks(self) -> int:
        return sum(p.num_blocks for p in self.pools)

    @property
    def capacity_tokens(self) -> int:
        return self.pools[0].num_blocks * self.block_size
