"""KVCacheManager: each request's blocks in the paged KV pool, in vLLM v1's words.

The scheduler asks it for room (`allocate_slots`) before it schedules a request's tokens and
gives the room back (`free`) when the request finishes or is preempted; `get_computed_blocks`
is where a prefix cache answers "these leading blocks are already computed" (none yet: every
request starts from zero). The block ids it hands out travel to the model runner inside the
SchedulerOutput; the runner never reads this object.
"""

from __future__ import annotations

from tacit.memory.block_pool import BlockPool


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._block_ids: dict[str, list[int]] = {}

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request_id: str) -> tuple[list[int], int]:
        """(blocks already holding this request's leading tokens, how many tokens they hold).
        Without a prefix cache nothing is shared, so a new request starts from zero."""
        return [], 0

    def allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> list[int] | None:
        """Make room for num_new_tokens more tokens: the blocks newly added (possibly none), or
        None, with nothing allocated, when the pool is short."""
        table = self._block_ids.setdefault(request_id, [])
        extra = self.blocks_needed(num_computed_tokens + num_new_tokens) - len(table)
        if extra <= 0:
            return []
        if extra > self.pool.num_free_blocks:
            return None
        new = self.pool.allocate(extra)
        table.extend(new)
        return new

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's blocks in order (a copy; empty if it holds none)."""
        return list(self._block_ids.get(request_id, ()))

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._block_ids.get(request_id, ()))

    def free(self, request_id: str) -> None:
        self.pool.free(self._block_ids.pop(request_id, []))

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.block_size
