"""BlockPool: a fixed set of block ids, handed out and taken back."""

import pytest

from tacit.memory.block_pool import BlockPool


def test_starts_all_free():
    pool = BlockPool(8)
    assert pool.num_blocks == 8
    assert pool.num_free_blocks == 8
    assert pool.num_used_blocks == 0


def test_allocate_hands_out_distinct_valid_ids():
    pool = BlockPool(8)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert len(a) == 3 and len(b) == 5
    assert sorted(a + b) == list(range(8))
    assert pool.num_free_blocks == 0 and pool.num_used_blocks == 8


def test_allocate_zero_is_empty():
    pool = BlockPool(4)
    assert pool.allocate(0) == []
    assert pool.num_free_blocks == 4


def test_over_allocation_raises_with_a_message_and_takes_nothing():
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(RuntimeError, match=r"asked for 2 KV blocks with 1 free"):
        pool.allocate(2)
    assert pool.num_free_blocks == 1
    assert len(pool.allocate(1)) == 1


def test_free_returns_blocks_for_reuse():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.free(blocks[:2])
    assert pool.num_free_blocks == 2 and pool.num_used_blocks == 2
    again = pool.allocate(2)
    assert sorted(again) == sorted(blocks[:2])
    pool.free(blocks[2:] + again)
    assert pool.num_free_blocks == 4


def test_empty_pool():
    pool = BlockPool(0)
    assert pool.num_free_blocks == 0
    assert pool.allocate(0) == []
    with pytest.raises(RuntimeError):
        pool.allocate(1)
