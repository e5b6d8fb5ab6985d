"""The KV manager over several KV cache groups: a sliding-window group gives back the blocks
behind its window as a request decodes, so a request's blocks stay bounded by the window in
that group while the full-attention group's table grows with the context."""

import pytest

from tacit.kv_cache_interface import blocks_for_tokens
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager

BS, WINDOW = 4, 8  # a window of 8 positions straddles at most 3 blocks of 4


def hybrid(num_blocks=64, chunk=8):
    # gpt-oss's layout: one sliding group, one full group.
    return PagedKVCacheManager(num_blocks, BS, sliding_windows=(WINDOW, None), max_chunk_tokens=chunk)


def decode(kv, rid, start, steps):
    for c in range(start, start + steps):
        assert kv.allocate_slots(rid, c, 1) is not None


def test_a_sliding_group_holds_only_its_window_as_the_context_grows():
    kv = hybrid()
    new = kv.allocate_slots("a", 0, 8)  # a prompt of 8 tokens: two blocks in each group
    assert [len(t) for t in new] == [2, 2]
    decode(kv, "a", 8, 92)  # to 100 tokens
    sliding, full = kv.get_block_ids("a")
    assert len(full) == 25 and len(set(full)) == 25  # every block of the context
    # The next query (position 100) reads positions 93-100: blocks 23-25 of the table. Everything
    # before block 23 was given back and stands as block 0 in the table (never read).
    assert len(sliding) == 25 and sliding[:23] == [0] * 23
    assert kv.num_blocks_of("a") == 25 + 2  # 25 full + blocks 23, 24 of the sliding table
    assert kv.num_free_blocks == 64 - 27
    # The blocks given back went to the pool: a second request of 72 tokens (18 + 18) gets them.
    assert kv.allocate_slots("b", 0, 72) is not None and kv.num_free_blocks == 1
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 64 and kv.num_used_blocks == 0


def test_the_window_covers_every_query_of_a_chunk():
    kv = hybrid(chunk=16)
    kv.allocate_slots("a", 0, 16)
    kv.allocate_slots("a", 16, 16)  # positions 16-31: the first reads from position 9 (block 2)
    sliding, _ = kv.get_block_ids("a")
    assert len(sliding) == 8 and sliding[:2] == [0, 0] and kv.num_blocks_of("a") == 6 + 8


def test_freed_ids_in_a_table_are_never_a_live_block_of_another_group():
    kv = hybrid()
    kv.allocate_slots("a", 0, 8)
    decode(kv, "a", 8, 40)
    sliding, full = kv.get_block_ids("a")
    held = [b for b in sliding if b] + full
    assert len(held) == len(set(held)) == kv.num_blocks_of("a")  # no id in two places at once


def test_blocks_needed_and_capacity_count_windows_not_contexts():
    kv = hybrid(num_blocks=40, chunk=8)
    # Full group: 100 tokens = 25 blocks; sliding: 7 window positions + an 8-token chunk = 15
    # consecutive positions, 5 blocks at the worst alignment.
    assert kv.blocks_needed(100) == 25 + 5 == blocks_for_tokens((WINDOW, None), BS, 100, 8)
    assert kv.capacity_tokens == (40 - 5) * BS
    # A request of exactly that many tokens fits alone, decoding token by token.
    kv.allocate_slots("a", 0, 8)
    decode(kv, "a", 8, kv.capacity_tokens - 8)
    assert kv.num_blocks_of("a") <= 40


def test_a_short_pool_takes_nothing():
    kv = hybrid(num_blocks=5)
    assert kv.allocate_slots("a", 0, 12) is None  # 3 + 3 blocks, 5 free
    assert kv.num_free_blocks == 5 and kv.num_blocks_of("a") == 0


def test_the_prefix_cache_is_refused_with_several_groups():
    with pytest.raises(ValueError, match="the prefix cache covers one KV cache group"):
        PagedKVCacheManager(8, BS, enable_caching=True, sliding_windows=(WINDOW, None))


def test_bench_window_kv_bytes_are_what_the_manager_holds_while_decoding():
    """`tacit bench attention --sliding-window`'s KV bytes a request equal the blocks the manager
    holds for a request decoded to that context (gpt-oss's alternation, window 8, blocks of 4)."""
    from tacit.bench.window_attention import measure_sliding_window

    hf = dict(
        architectures=["GptOssForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        hidden_size=32,
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=WINDOW,
        max_position_embeddings=4096,
    )
    full_row, sliding_row = measure_sliding_window(hf, context=100, repeats=1, block_size=BS)
    kv = hybrid()
    kv.allocate_slots("a", 0, 8)
    decode(kv, "a", 8, 92)  # 100 tokens computed; the next step's block is allocated with it
    page = 2 * BS * 2 * 8 * 2  # K and V, 4 slots, 2 kv heads x 8, bf16: one layer's block
    layers_per_block = 2  # two groups of two layers share two tensors
    assert full_row["kv_mb_per_request"] * 2**20 == 4 * 25 * page
    assert sliding_row["kv_mb_per_request"] * 2**20 == kv.num_blocks_of("a") * layers_per_block * page
