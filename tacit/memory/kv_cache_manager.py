"""KVCacheManager: each request's block table, grown a step at a time (vLLM v1's allocate_slots)."""

from __future__ import annotations

from tacit.memory.block_pool import BlockPool


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> bool:
        """Make room for num_new_tokens more; False (and nothing allocated) when the pool is short."""
        table = self.block_tables.setdefault(request_id, [])
        extra = self.blocks_needed(num_computed_tokens + num_new_tokens) - len(table)
        if extra <= 0:
            return True
        if extra > self.pool.num_free_blocks:
            return False
        table.extend(self.pool.allocate(extra))
        return True

    def free(self, request_id: str) -> None:
        self.pool.free(self.block_tables.pop(request_id, []))

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.block_size
