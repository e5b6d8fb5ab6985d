"""KVCacheManager: the interface the scheduler keeps each request's KV blocks through, in vLLM
v1's words.

The scheduler asks it for room (`allocate_slots`) before it schedules a request's tokens and
gives the room back (`free`) when the request finishes or is preempted; `get_computed_blocks`
is where a prefix cache answers "these leading blocks are already computed". The block ids it
hands out travel to the model runner inside the SchedulerOutput; the runner never reads this
object. PagedKVCacheManager (paged_kv_cache_manager.py) is the implementation; the engine builds
it from the worker's KVCacheConfig.

Under data-parallel attention each rank holds its own pool and attends only over its own
requests: a manager keeps num_pools pools, places each request in one and hands out block ids
local to that pool; pool_of(request) tells the runners which rank holds it.

The rule the prefix cache and speculative decoding both rely on, set here for every manager:
only blocks full of verified tokens are ever hashed or shared (shareable_blocks). A verified
token is one whose KV a step wrote and the scheduler kept: num_computed_tokens as allocate_slots
was last told it. A verify step's draft tokens are scheduled past them, so their slots lie in
blocks that are not yet full of verified tokens; rolling back the rejected ones only rewinds the
request's num_computed_tokens (the runner writes the next tokens over those slots), so it never
frees or changes a block that is shared.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from tacit.memory.block_hash import BlockHash


class KVCacheManager(ABC):
    block_size: int
    enable_caching: bool = False  # a prefix cache: the scheduler hashes blocks only for one
    # Prompt tokens looked up in the prefix cache, and found (vLLM's prefix_cache_queries / hits).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_cached_blocks: int = 0  # blocks the prefix cache can find now

    # ---- placement: one pool per data-parallel attention rank -----------------------------

    @property
    @abstractmethod
    def num_pools(self) -> int: ...

    @abstractmethod
    def place(self, request_id: str, pool: int) -> None:
        """Put a request that holds no blocks yet in `pool` (the scheduler's choice)."""

    @abstractmethod
    def pool_of(self, request_id: str) -> int:
        """The pool (the data-parallel rank) that holds the request's blocks; 0 with one pool."""

    @abstractmethod
    def same_pool(self, a: str, b: str) -> bool:
        """Whether freeing a's blocks could make room for b."""

    # ---- a request's blocks -----------------------------------------------------------------

    @abstractmethod
    def get_computed_blocks(
        self, request_id: str, block_hashes: list[BlockHash], num_tokens: int
    ) -> tuple[list[int], int]:
        """(blocks already holding the leading tokens of a request of num_tokens tokens whose
        full blocks hash to block_hashes, how many tokens they hold): a prefix cache's hit, only
        ever whole shareable blocks, and always short of the last token (its logits are needed).
        Nothing is taken until allocate_slots is handed the blocks."""

    @abstractmethod
    def allocate_slots(
        self,
        request_id: str,
        num_computed_tokens: int,
        num_new_tokens: int,
        new_computed_blocks: list[int] | None = None,
    ) -> tuple[list[int], ...] | None:
        """Make room for num_new_tokens more tokens (draft tokens to verify among them) past
        num_computed_tokens (all verified), first taking new_computed_blocks (a prefix hit from
        get_computed_blocks, for a request holding no blocks): the blocks newly allocated to
        each KV cache group's table (possibly none), or None, with nothing taken or allocated,
        when the pool is short."""

    @abstractmethod
    def cache_blocks(self, request_id: str, block_hashes: list[BlockHash], num_verified_tokens: int) -> None:
        """The request's first num_verified_tokens tokens are computed and kept: its blocks full
        of them may now be found by later requests (a no-op without a prefix cache)."""

    def cached_prefix_blocks(self, block_hashes: list[BlockHash], num_tokens: int, pool: int) -> int:
        """How many leading blocks of a num_tokens request's hashes `pool` would hand it, as
        get_computed_blocks would, without taking or counting anything (placement, estimates)."""
        return 0

    def usable_prefix(self, block_hashes: list[BlockHash], num_tokens: int) -> list[BlockHash]:
        """The hashes of the blocks a hit may cover for a num_tokens request: never the block
        holding its last token (that token's logits are needed)."""
        return block_hashes[: (num_tokens - 1) // self.block_size]

    def take_evicted(self) -> list[tuple[int, BlockHash]]:
        """The (block, hash) of every cached block handed out for something else since the last
        call, while their tokens are still in them (a second tier stores them; memory/kv_offload.py).
        Empty for a manager that does not record evictions."""
        return []

    def cached_blocks(self) -> list[tuple[int, BlockHash]]:
        """Every (block, hash) the prefix cache holds, most valuable first (what a second tier
        saves at shutdown). Empty without a prefix cache."""
        return []

    @abstractmethod
    def num_verified_tokens(self, request_id: str) -> int:
        """The request's tokens whose KV is written and kept (0 if it holds no blocks)."""

    @abstractmethod
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table of each KV cache group, in order (copies; empty if it holds
        none). A sliding-window group's entries behind its window are given back: block 0."""

    @abstractmethod
    def num_blocks_of(self, request_id: str) -> int: ...

    @abstractmethod
    def num_unshared_blocks(self, request_id: str) -> int:
        """The request's blocks no other request holds: how many free() would return to the free
        queue now. Blocks it shares through the prefix cache stay held by the others, so a
        request whose blocks are all shared frees nothing (what preemption asks before choosing
        a victim for room)."""

    @abstractmethod
    def free(self, request_id: str) -> None:
        """Give back the request's blocks (finished, or preempted: placed anew when it next gets blocks)."""

    def shareable_blocks(self, request_id: str) -> list[int]:
        """The request's leading blocks a prefix cache may hash and share: those full of verified
        tokens. Never a partly filled block, never one holding a draft token."""
        return self.get_block_ids(request_id)[0][: self.num_verified_tokens(request_id) // self.block_size]

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- accounting ---------------------------------------------------------------------------

    @property
    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def num_free_blocks_in(self, pool: int) -> int: ...

    @property
    @abstractmethod
    def num_used_blocks(self) -> int: ...

    @property
    @abstractmethod
    def num_blocks(self) -> int:
        """Every pool's blocks together."""

    @property
    @abstractmethod
    def capacity_tokens(self) -> int:
        """The most tokens one request can hold: one pool's (a request lives in one)."""
