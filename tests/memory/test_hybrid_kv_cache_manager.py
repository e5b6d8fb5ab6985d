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


def _hashes(n: int) -> list[bytes]:
    return [bytes([i]) * 32 for i in range(n)]


def _cached_request(kv, hashes, tokens: int) -> dict[int, tuple[int, int]]:
    """Prefill 8 tokens and decode to `tokens`, naming verified blocks after every step as the
    scheduler does; {block index: (sliding block, full block)} as each was while held."""
    seen = {}
    kv.allocate_slots("a", 0, 8)
    kv.cache_blocks("a", hashes, 8)
    for c in range(8, tokens):
        kv.allocate_slots("a", c, 1)
        kv.cache_blocks("a", hashes, c + 1)
        sliding, full = kv.get_block_ids("a")
        released = kv._released["a"][0]
        seen.update({i: (sliding[i], full[i]) for i in range(released, len(sliding))})
    kv.free("a")
    return seen


def test_a_prefix_hit_takes_the_full_groups_prefix_and_only_the_window_of_a_sliding_group():
    kv = PagedKVCacheManager(64, BS, enable_caching=True, sliding_windows=(WINDOW, None), max_chunk_tokens=8)
    hashes = _hashes(10)
    seen = _cached_request(kv, hashes, 41)  # 41 tokens: 10 full blocks verified
    # The same 10 blocks and one token more: every block but the last token's is a hit (40
    # tokens); the next query (position 40) reads positions 33-40, so the sliding group takes
    # blocks 8 and 9 only and stands block 0 for the 8 behind.
    hit, tokens = kv.get_computed_blocks("b", hashes, 41)
    sliding, full = hit
    assert tokens == 40
    assert full == [seen[i][1] for i in range(10)]
    assert sliding == [0] * 8 + [seen[8][0], seen[9][0]]
    assert kv.allocate_slots("b", tokens, 1, hit) is not None
    assert kv.num_blocks_of("b") == 11 + 3  # + token 40's block in each group
    kv.free("b")
    assert kv.num_free_blocks == 64


def test_a_hit_is_shortened_until_the_sliding_group_holds_its_window():
    kv = PagedKVCacheManager(64, BS, enable_caching=True, sliding_windows=(WINDOW, None), max_chunk_tokens=8)
    hashes = _hashes(10)
    seen = _cached_request(kv, hashes, 41)
    pool = kv.pools[0]
    for i in (8, 9):  # evict the sliding group's blocks 8 and 9 (group 0 names them by the plain hash)
        pool._hash_of.pop(pool._block_of.pop(hashes[i]))
    # 10 and 9 blocks need sliding block 8; 8 blocks (32 tokens) need positions 25-32: blocks 6, 7.
    hit, tokens = kv.get_computed_blocks("b", hashes, 41)
    sliding, full = hit
    assert tokens == 32
    assert full == [seen[i][1] for i in range(8)] and sliding == [0] * 6 + [seen[6][0], seen[7][0]]
    assert kv.allocate_slots("b", tokens, 41 - tokens, hit) is not None


@pytest.mark.parametrize("window, block_size", [(3, 2), (5, 4), (8, 4), (13, 2)])
def test_a_lone_request_reaches_the_capacity_the_pool_reports(window, block_size):
    """capacity_tokens (what max_model_len is capped to and prompts are refused beyond) is met in
    chunks of any size up to max_chunk_tokens: the blocks a sliding group gives back in a call
    are room for that call's new ones (before, 363 of these pools refused a lone request short
    of its capacity)."""
    for chunk in (1, 3, 4, 6):
        for num_blocks in range(6, 30):
            kv = PagedKVCacheManager(num_blocks, block_size, sliding_windows=(window, None), max_chunk_tokens=chunk)
            c = 0
            while c < kv.capacity_tokens:
                n = min(chunk, kv.capacity_tokens - c)
                assert kv.allocate_slots("a", c, n) is not None, (chunk, num_blocks, c)
                c += n


def test_a_table_begun_past_the_window_holds_only_the_window():
    """Slots asked for a request whose computed tokens lie behind its window and which holds no
    blocks yet: the sliding group allocates the window's blocks only, block 0 standing for the rest."""
    kv = hybrid()
    new = kv.allocate_slots("a", 40, 1)  # the next query, position 40, reads positions 33-40
    sliding, full = kv.get_block_ids("a")
    assert len(full) == 11 and len(sliding) == 11 and sliding[:8] == [0] * 8
    assert [len(b) for b in new] == [3, 11] and kv.num_blocks_of("a") == 14
    kv.free("a")
    assert kv.num_free_blocks == 64
