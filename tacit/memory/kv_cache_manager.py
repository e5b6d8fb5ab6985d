"""KVCacheManager: each request's blocks in the paged KV pool, in vLLM v1's words.

The scheduler asks it for room (`allocate_slots`) before it schedules a request's tokens and
gives the room back (`free`) when the request finishes or is preempted; `get_computed_blocks`
is where a prefix cache answers "these leading blocks are already computed" (none yet: every
request starts from zero). The block ids it hands out travel to the model runner inside the
SchedulerOutput; the runner never reads this object.

Under data-parallel attention each rank holds its own pool of num_blocks blocks and attends only
over its own requests: the manager keeps num_pools pools, places each request in one (the
scheduler's choice, or else the one with the most free blocks when it first gets blocks) and
hands out block ids local to that pool; pool_of(request) tells the runners which rank holds it.
"""

from __future__ import annotations

from tacit.memory.block_pool import BlockPool


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, num_pools: int = 1) -> None:
        """num_blocks per pool; num_pools: one per data-parallel attention rank (1 otherwise)."""
        if num_pools < 1:
            raise ValueError(f"num_pools={num_pools} is invalid: must be >= 1")
        self.block_size = block_size
        self.pools = [BlockPool(num_blocks) for _ in range(num_pools)]
        self._block_ids: dict[str, list[int]] = {}
        self._pool_of: dict[str, int] = {}

    @property
    def num_pools(self) -> int:
        return len(self.pools)

    def place(self, request_id: str, pool: int) -> None:
        """Put a request that holds no blocks yet in `pool` (the scheduler's choice, from how much
        of the step's budget each pool has left)."""
        if self._block_ids.get(request_id):
            raise RuntimeError(f"request {request_id} already holds blocks in pool {self._pool_of[request_id]}")
        if not 0 <= pool < len(self.pools):
            raise ValueError(f"pool {pool} does not exist: there are {len(self.pools)}")
        self._pool_of[request_id] = pool

    def pool_of(self, request_id: str) -> int:
        """The pool (the data-parallel rank) that holds the request's blocks; 0 with one pool."""
        return self._pool_of.get(request_id, 0)

    def same_pool(self, a: str, b: str) -> bool:
        """Whether freeing a's blocks could make room for b (both placed in one pool)."""
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
        pool = self._pool_for(request_id, extra)
        if pool is None or extra > pool.num_free_blocks:
            return None
        new = pool.allocate(extra)
        table.extend(new)
        return new

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's blocks in order (a copy; empty if it holds none)."""
        return list(self._block_ids.get(request_id, ()))

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._block_ids.get(request_id, ()))

    def free(self, request_id: str) -> None:
        """Give back the request's blocks; a request freed (finished, or preempted) is placed anew
        when it next gets blocks."""
        pool = self._pool_of.pop(request_id, 0)
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
        """The most tokens one request can hold: one pool's (a request lives in one)."""
        return self.pools[0].num_blocks * self.block_size
