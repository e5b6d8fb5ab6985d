"""PagedKVCacheManager (the KVCacheManager): per-request block tables grown a step at a time, observed through the pool."""

import pytest
import torch

from tacit.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager


@pytest.mark.parametrize("tokens,blocks", [(0, 0), (1, 1), (15, 1), (16, 1), (17, 2), (32, 2), (33, 3)])
def test_blocks_needed_rounds_up(tokens, blocks):
    assert PagedKVCacheManager(num_blocks=4, block_size=16).blocks_needed(tokens) == blocks


def test_capacity_tokens():
    kv = PagedKVCacheManager(num_blocks=10, block_size=16)
    assert kv.capacity_tokens == 160
    assert kv.num_blocks == 10 and kv.num_free_blocks == 10


def test_prefill_allocates_just_enough_blocks():
    kv = PagedKVCacheManager(num_blocks=10, block_size=4)
    assert kv.allocate_slots("a", num_computed_tokens=0, num_new_tokens=9) is not None
    assert kv.num_used_blocks == 3


def test_decode_grows_the_table_one_block_at_a_time():
    kv = PagedKVCacheManager(num_blocks=10, block_size=4)
    assert kv.allocate_slots("a", 0, 4) is not None  # prompt fills block 1 exactly
    used = [kv.num_used_blocks]
    for computed in range(4, 13):  # one decode token per step: tokens 5..13
        assert kv.allocate_slots("a", computed, 1) is not None
        used.append(kv.num_used_blocks)
    # a new block only when a token spills over a block boundary (tokens 5 and 9 and 13)
    assert used == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4]


def test_allocate_within_existing_blocks_is_free_of_charge():
    kv = PagedKVCacheManager(num_blocks=2, block_size=8)
    (first,) = kv.allocate_slots("a", 0, 8)
    assert len(first) == 1 and kv.get_block_ids("a") == (first,)
    assert kv.allocate_slots("a", 0, 8) == ([],)  # same span again: nothing new
    assert kv.allocate_slots("a", 3, 2) == ([],)  # within the span already held
    assert kv.num_used_blocks == 1


def test_allocate_slots_returns_the_new_blocks_in_table_order():
    kv = PagedKVCacheManager(num_blocks=6, block_size=4)
    (a,) = kv.allocate_slots("a", 0, 6)
    (b,) = kv.allocate_slots("b", 0, 3)
    (more,) = kv.allocate_slots("a", 6, 4)  # 10 tokens: a third block
    assert len(a) == 2 and len(b) == 1 and len(more) == 1
    assert kv.get_block_ids("a") == (a + more,) and kv.num_blocks_of("a") == 3
    assert not set(kv.get_block_ids("a")[0]) & set(b)
    assert kv.get_computed_blocks("c", [b"h"], 20) == ([], 0)  # no prefix cache: a new request starts from zero


def test_short_pool_returns_false_and_allocates_nothing():
    kv = PagedKVCacheManager(num_blocks=3, block_size=4)
    assert kv.allocate_slots("a", 0, 8) is not None  # 2 blocks
    assert kv.allocate_slots("b", 0, 8) is None  # needs 2, 1 free
    assert kv.num_free_blocks == 1
    assert kv.allocate_slots("a", 8, 5) is None  # needs 2 more, 1 free
    assert kv.num_free_blocks == 1
    # what does fit still fits
    assert kv.allocate_slots("b", 0, 4) is not None
    assert kv.num_free_blocks == 0


def test_free_returns_a_requests_blocks():
    kv = PagedKVCacheManager(num_blocks=4, block_size=4)
    assert kv.allocate_slots("a", 0, 8) is not None
    assert kv.allocate_slots("b", 0, 4) is not None
    kv.free("a")
    assert kv.num_free_blocks == 3
    # a freed request starts from an empty table
    assert kv.allocate_slots("a", 0, 4) is not None
    assert kv.num_used_blocks == 2
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 4


def test_free_unknown_or_twice_is_harmless():
    kv = PagedKVCacheManager(num_blocks=2, block_size=4)
    kv.free("nobody")
    assert kv.allocate_slots("a", 0, 4) is not None
    kv.free("a")
    kv.free("a")  # must not return the block twice
    assert kv.num_free_blocks == 2


def test_free_after_a_refused_allocation():
    kv = PagedKVCacheManager(num_blocks=1, block_size=4)
    assert kv.allocate_slots("a", 0, 8) is None
    kv.free("a")
    assert kv.num_free_blocks == 1


def test_freed_blocks_serve_a_waiting_request():
    kv = PagedKVCacheManager(num_blocks=4, block_size=4)
    assert kv.allocate_slots("a", 0, 16) is not None
    assert kv.allocate_slots("b", 0, 8) is None
    kv.free("a")
    assert kv.allocate_slots("b", 0, 8) is not None
    assert kv.num_used_blocks == 2


def test_pools_place_each_request_in_the_emptiest_and_hand_out_local_ids():
    """Data-parallel attention: one pool per rank; a request lives in one and its block ids
    index that pool (each rank's own KV cache)."""
    kv = PagedKVCacheManager(num_blocks=4, block_size=4, num_pools=2)
    assert kv.num_blocks == 8 and kv.capacity_tokens == 16  # one request can use one pool
    assert kv.allocate_slots("a", 0, 12) == ([0, 1, 2],)
    assert kv.allocate_slots("b", 0, 4) == ([0],)  # pool 1 had more free blocks
    assert (kv.pool_of("a"), kv.pool_of("b")) == (0, 1)
    assert kv.allocate_slots("c", 0, 8) == ([1, 2],)  # pool 1 again: 3 free against pool 0's 1
    assert kv.same_pool("b", "c") and not kv.same_pool("a", "c")
    # Pool 0 has 1 block left: a grows there or fails, whatever pool 1 holds.
    assert kv.allocate_slots("a", 12, 5) is None
    assert kv.allocate_slots("a", 12, 4) == ([3],)
    assert kv.num_free_blocks == 1 and kv.num_used_blocks == 7
    kv.free("c")
    assert kv.num_free_blocks == 3 and kv.pool_of("c") == 0  # freed: placed anew next time


def test_a_request_too_big_for_every_pool_is_not_placed():
    kv = PagedKVCacheManager(num_blocks=2, block_size=4, num_pools=2)
    assert kv.allocate_slots("a", 0, 12) is None
    assert kv.num_free_blocks == 4 and kv.num_blocks_of("a") == 0


def test_place_pins_a_request_to_a_pool():
    kv = PagedKVCacheManager(num_blocks=2, block_size=4, num_pools=2)
    assert kv.allocate_slots("a", 0, 4) == ([0],)  # pool 0
    kv.place("b", 0)
    assert kv.allocate_slots("b", 0, 4) == ([1],) and kv.pool_of("b") == 0
    kv.place("c", 0)
    assert kv.allocate_slots("c", 0, 4) is None  # pool 0 is full; pool 1's room is not c's
    with pytest.raises(RuntimeError, match="already holds blocks"):
        kv.place("a", 1)
    with pytest.raises(ValueError, match="pool 2 does not exist"):
        kv.place("d", 2)


def test_only_blocks_full_of_verified_tokens_are_shareable():
    """The rule the prefix cache and speculation share: a block full of verified tokens may be
    hashed and shared; a block holding a draft token's slot never is."""
    kv = PagedKVCacheManager(num_blocks=8, block_size=4)
    kv.allocate_slots("a", 0, 6)
    assert kv.shareable_blocks("a") == []  # nothing verified yet: the prompt's KV is being written
    blocks = kv.allocate_slots("a", 6, 6) and kv.get_block_ids("a")[0]  # its token + 5 drafts: 12 slots
    assert kv.num_verified_tokens("a") == 6 and len(blocks) == 3
    assert kv.shareable_blocks("a") == blocks[:1]  # tokens 1-4; block 2 holds 2 verified, 2 draft slots
    kv.allocate_slots("a", 9, 1)  # 2 drafts accepted, the rest rolled back: 9 verified, no block freed
    assert kv.get_block_ids("a") == (blocks,) and kv.shareable_blocks("a") == blocks[:2]
    kv.free("a")
    assert kv.num_verified_tokens("a") == 0 and kv.shareable_blocks("a") == []


def test_the_manager_is_an_interface_the_paged_one_implements():
    with pytest.raises(TypeError, match="abstract"):
        KVCacheManager()

    class NoPrefixLookup(PagedKVCacheManager):
        get_computed_blocks = KVCacheManager.get_computed_blocks  # the ABC's, still abstract

    with pytest.raises(TypeError, match="abstract method.*get_computed_blocks"):
        NoPrefixLookup(4, 4)
    assert isinstance(PagedKVCacheManager(4, 4), KVCacheManager)


def test_the_paged_manager_is_built_from_the_workers_kv_cache_config():
    spec = FullAttentionSpec(block_size=8, dtype=torch.bfloat16, num_kv_heads=2, head_size=64)
    config = KVCacheConfig(
        num_blocks=5, kv_cache_groups=(KVCacheGroupSpec(("l0",), spec),), max_model_len=40, num_pools=2
    )
    kv = PagedKVCacheManager.from_kv_cache_config(config)
    assert (kv.num_pools, kv.num_blocks, kv.block_size, kv.capacity_tokens) == (2, 10, 8, 40)
