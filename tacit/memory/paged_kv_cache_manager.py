"""PagedKVCacheManager: the KVCacheManager over one block table per request and KV cache group.

Groups share the cache tensors (tacit/kv_cache_interface.py), so every group draws its block
ids from one pool, and a request holds one table per group: a full-attention group's grows with
its context; a sliding-window group's gives back, each time the request is given slots, the
blocks no query from its next token on can reach (positions before num_computed - window + 1),
so its share stays at the window plus a step's chunk however long the context grows. A freed
entry stays in the table as block 0, never read (the window's gather starts past it), so
positions and table indexes keep agreeing. Under
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

from tacit.kv_cache_interface import KVCacheConfig, blocks_for_tokens, capacity_tokens_of
from tacit.memory.block_hash import BlockHash
from tacit.memory.block_pool import BlockPool
from tacit.memory.hybrid_prefix import find_hybrid_hit, group_hash
from tacit.memory.kv_cache_manager import KVCacheManager


class PagedKVCacheManager(KVCacheManager):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_pools: int = 1,
        enable_caching: bool = False,
        record_evictions: bool = False,
        sliding_windows: tuple[int | None, ...] = (None,),
        max_chunk_tokens: int = 0,
    ) -> None:
        """num_blocks per pool; num_pools: one per data-parallel attention rank (1 otherwise);
        enable_caching: the prefix cache; record_evictions: for a second tier (take_evicted),
        which needs the prefix cache and one pool; sliding_windows: each KV cache group's window
        (None: full attention), one table per group; max_chunk_tokens: the most tokens a step
        computes for one request (what a sliding group holds beyond its window, blocks_needed)."""
        if num_pools < 1:
            raise ValueError(f"num_pools={num_pools} is invalid: must be >= 1")
        if not sliding_windows:
            raise ValueError("sliding_windows: one entry per KV cache group, none given")
        if record_evictions and (not enable_caching or num_pools != 1):
            raise ValueError(
                f"a second KV tier needs the prefix cache on and one pool (enable_caching={enable_caching}, "
                f"num_pools={num_pools})"
            )
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.sliding_windows = tuple(sliding_windows)
        self.max_chunk_tokens = max_chunk_tokens
        self.pools = [BlockPool(num_blocks, record_evictions) for _ in range(num_pools)]
        # Per request, one table per group; _released[r][g]: its leading entries given back.
        self._block_ids: dict[str, list[list[int]]] = {}
        self._released: dict[str, list[int]] = {}
        self._pool_of: dict[str, int] = {}
        self._verified: dict[str, int] = {}
        self._num_cached: dict[str, list[int]] = {}  # per group, leading blocks already cached

    @classmethod
    def from_kv_cache_config(
        cls, config: KVCacheConfig, enable_caching: bool = False, record_evictions: bool = False
    ) -> PagedKVCacheManager:
        """The manager of the pool the worker allocated (Executor.kv_cache_config)."""
        return cls(
            config.num_blocks,
            config.block_size,
            config.num_pools,
            enable_caching,
            record_evictions,
            config.sliding_windows,
            config.max_chunk_tokens,
        )

    @property
    def num_pools(self) -> int:
        return len(self.pools)

    @property
    def num_groups(self) -> int:
        return len(self.sliding_windows)

    def place(self, request_id: str, pool: int) -> None:
        if self.num_blocks_of(request_id):
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
    ) -> tuple[list[int] | tuple[list[int], ...], int]:
        """With several groups the hit is one list per group (hybrid_prefix.find_hybrid_hit),
        or [] when there is none."""
        if not self.enable_caching:
            return [], 0
        blocks = self._hit(self.pools[self._pool_of.get(request_id, 0)], block_hashes, num_tokens)
        tokens = len(blocks[0] if isinstance(blocks, tuple) else blocks) * self.block_size
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += tokens
        return (blocks if tokens else []), tokens

    def _hit(
        self, pool: BlockPool, block_hashes: list[BlockHash], num_tokens: int
    ) -> list[int] | tuple[list[int], ...]:
        usable = self.usable_prefix(block_hashes, num_tokens)
        if self.num_groups == 1:
            return pool.lookup(usable)
        return find_hybrid_hit(pool, usable, self.sliding_windows, self.block_size)

    def cached_prefix_blocks(self, block_hashes: list[BlockHash], num_tokens: int, pool: int) -> int:
        if not self.enable_caching:
            return 0
        hit = self._hit(self.pools[pool], block_hashes, num_tokens)
        return len(hit[0] if isinstance(hit, tuple) else hit)

    def allocate_slots(
        self,
        request_id: str,
        num_computed_tokens: int,
        num_new_tokens: int,
        new_computed_blocks: list[int] | tuple[list[int], ...] | None = None,
    ) -> tuple[list[int], ...] | None:
        tables = self._block_ids.setdefault(request_id, [[] for _ in self.sliding_windows])
        released = self._released.setdefault(request_id, [0] * self.num_groups)
        # The hit as get_computed_blocks gave it: one list (one group) or one per group.
        hits = new_computed_blocks or []
        per_group = hits if isinstance(hits, tuple) else (hits,) + tuple([] for _ in tables[1:])
        # A sliding group's hit starts with block 0 for each position behind its window.
        behind = [len(h) - len(self._live(h, g, len(h))) for g, h in enumerate(per_group)]
        taken = [b for g, h in enumerate(per_group) for b in h[behind[g] :]]
        if taken and tables[0]:
            raise RuntimeError(f"request {request_id} already holds blocks: a prefix hit comes before any")
        # First, what no query from here on reads (never needed again, whatever this call
        # answers): the room a sliding group's peak was sized with counts it as free.
        self._release_behind_windows(request_id, num_computed_tokens)
        for g, table in enumerate(tables):
            # A sliding group whose table starts past its window (computed tokens it never held
            # blocks for: a hit, or any table begun late) stands block 0 for those positions.
            if len(table) < released[g] and not per_group[g]:
                table.extend([0] * (released[g] - len(table)))
        need = self.blocks_needed_by_table(num_computed_tokens + num_new_tokens)
        extra = [need - len(t) - len(h) for t, h in zip(tables, per_group)]
        total = sum(max(e, 0) for e in extra)
        if total > 0 or taken:
            pool = self._pool_for(request_id, total)
            # Hit blocks sitting in the free queue stop being free once taken.
            if pool is None or total > pool.num_free_blocks - pool.num_free_among(taken):
                return None
        self._verified[request_id] = num_computed_tokens
        if taken:
            pool.touch(taken)
            for g, h in enumerate(per_group):
                tables[g].extend(h)
                released[g] = behind[g]
            self._num_cached[request_id] = [len(h) for h in per_group]
        out = tuple(pool.allocate(e) if e > 0 else [] for e in extra)
        for table, new in zip(tables, out):
            table.extend(new)
        return out

    def blocks_needed_by_table(self, num_tokens: int) -> int:
        """Entries each group's table needs for num_tokens tokens (released ones included)."""
        return -(-num_tokens // self.block_size)

    def _live(self, hit: list[int], group: int, length: int) -> list[int]:
        """The entries of a sliding group's hit of `length` blocks within its window."""
        window = self.sliding_windows[group]
        if window is None or not hit:
            return hit
        return hit[max(length * self.block_size - window + 1, 0) // self.block_size :]

    def _release_behind_windows(self, request_id: str, num_computed_tokens: int) -> None:
        """Give back each sliding group's blocks that no query from num_computed_tokens on can
        reach (all of its positions lie before num_computed_tokens - window + 1)."""
        tables, released = self._block_ids[request_id], self._released[request_id]
        pool = None
        for g, window in enumerate(self.sliding_windows):
            if window is None:
                continue
            behind = max(num_computed_tokens - window + 1, 0) // self.block_size
            upto = min(behind, len(tables[g]))
            if upto > released[g]:
                pool = pool or self.pools[self._pool_of.get(request_id, 0)]
                pool.free(tables[g][released[g] : upto])
                tables[g][released[g] : upto] = [0] * (upto - released[g])
            released[g] = max(released[g], behind)

    def cache_blocks(self, request_id: str, block_hashes: list[BlockHash], num_verified_tokens: int) -> None:
        tables = self._block_ids.get(request_id)
        if not tables or not tables[0]:
            return
        self._verified[request_id] = max(self._verified.get(request_id, 0), num_verified_tokens)
        if not self.enable_caching:
            return
        done = self._num_cached.setdefault(request_id, [0] * self.num_groups)
        released = self._released[request_id]
        pool = self.pools[self._pool_of.get(request_id, 0)]
        for g, table in enumerate(tables):
            full = min(num_verified_tokens // self.block_size, len(block_hashes), len(table))
            # Entries a sliding group gave back before they were named are not its any more.
            for i in range(max(done[g], released[g]), full):
                pool.cache(table[i], group_hash(block_hashes[i], g))
            done[g] = max(done[g], full)

    def take_evicted(self) -> list[tuple[int, BlockHash]]:
        return [e for p in self.pools for e in p.take_evicted()]

    def cached_blocks(self) -> list[tuple[int, BlockHash]]:
        return [e for p in self.pools for e in p.cached_blocks()]

    def num_verified_tokens(self, request_id: str) -> int:
        return self._verified.get(request_id, 0)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        tables = self._block_ids.get(request_id)
        if tables is None:
            return tuple([] for _ in self.sliding_windows)
        return tuple(list(t) for t in tables)

    def _held(self, request_id: str) -> list[int]:
        """Every block the request holds now, group by group (released entries left out)."""
        tables, released = self._block_ids.get(request_id), self._released.get(request_id)
        if not tables:
            return []
        return [b for t, r in zip(tables, released) for b in t[r:]]

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._held(request_id))

    def num_unshared_blocks(self, request_id: str) -> int:
        return self.pools[self._pool_of.get(request_id, 0)].num_unshared_among(self._held(request_id))

    def free(self, request_id: str) -> None:
        held = self._held(request_id)
        pool = self._pool_of.pop(request_id, 0)
        self._verified.pop(request_id, None)
        self._num_cached.pop(request_id, None)
        self._block_ids.pop(request_id, None)
        self._released.pop(request_id, None)
        # Tail first: the blocks only this request's longest prefix reaches are evicted first.
        self.pools[pool].free(reversed(held) if self.enable_caching else held)

    def blocks_needed(self, num_tokens: int) -> int:
        """Block ids a request of num_tokens tokens holds: a table's worth in each full group,
        at most a window and a step's chunk in each sliding one."""
        return blocks_for_tokens(self.sliding_windows, self.block_size, num_tokens, self.max_chunk_tokens)

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
        return capacity_tokens_of(
            self.sliding_windows, self.block_size, self.pools[0].num_blocks, self.max_chunk_tokens
        )
