"""The scheduler under data-parallel attention: one KV pool per rank, each rank its share of a
step's token budget, each request placed where there is room and budget."""

import pytest

from tacit.config import SchedulerConfig
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.scheduling.scheduler import Scheduler
from tacit.scheduling.step_budget import StepBudget
from tests.scheduling.helpers import advance, make_req, run_step


def scheduler(num_blocks: int = 64, budget: int = 64, pools: int = 2) -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16)
    return Scheduler(config, PagedKVCacheManager(num_blocks, block_size=16, num_pools=pools))


def test_step_budget_splits_evenly_and_refuses_overspending():
    b = StepBudget(65, 2)
    assert b.left == [33, 32] and b.total == 65
    b.spend(1, 32)
    assert b.of(1) == 0 and b.total == 33
    assert StepBudget(64).left == [64]
    with pytest.raises(RuntimeError, match="pool 0 spends 34 tokens with 33 left"):
        b.spend(0, 34)


def test_two_long_prompts_prefill_side_by_side_on_both_ranks():
    """With one shared budget the first prompt took all 64 tokens of a step on rank 0 while
    rank 1 idled; split, each rank prefills its own prompt's 32-token chunk."""
    s = scheduler()
    s.add_request(make_req("a", 100))
    s.add_request(make_req("b", 100))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 32, "b": 32}
    assert sorted(r.dp_rank for r in out.scheduled_new_reqs) == [0, 1]


def test_short_requests_alternate_ranks_and_decodes_stay_where_they_are():
    s = scheduler()
    for i in range(4):
        s.add_request(make_req(f"r{i}", 8, max_tokens=4))
    out = s.schedule()
    ranks = {r.req_id: r.dp_rank for r in out.scheduled_new_reqs}
    assert sorted(ranks.values()) == [0, 0, 1, 1]
    advance(s, out)
    for _ in range(3):
        run_step(s)
        assert all(s.kv.pool_of(rid) == rank for rid, rank in ranks.items() if rid in s.requests)


def test_one_pool_keeps_one_budget():
    s = scheduler(pools=1)
    s.add_request(make_req("a", 100))
    s.add_request(make_req("b", 100))
    assert s.schedule().num_scheduled_tokens == {"a": 64}


def test_each_rank_prefills_its_own_long_prompt():
    """One long-prefill slot a step is one a rank: two 1024-token prompts prefill side by side
    (with one slot for both ranks, one rank's attention idled every step: ~20% of rank 0's
    prefill time blocked at the gathers on random:deepseek-v3-1b)."""
    config = SchedulerConfig(max_num_batched_tokens=2048, long_prefill_token_threshold=512, max_long_partial_prefills=1)
    for pools, expected in [(2, {"a": 512, "b": 512}), (1, {"a": 512})]:
        s = Scheduler(config, PagedKVCacheManager(256, block_size=16, num_pools=pools))
        s.add_request(make_req("a", 1024))
        s.add_request(make_req("b", 1024))
        out = s.schedule()
        assert out.num_scheduled_tokens == expected
        assert sorted(r.dp_rank for r in out.scheduled_new_reqs) == list(range(len(expected)))


def test_a_request_goes_to_the_rank_caching_its_prefix():
    """With the prefix cache, the rank whose pool holds a request's leading blocks takes it,
    even when the other rank has more budget and free blocks."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16)
    s = Scheduler(config, PagedKVCacheManager(64, block_size=16, num_pools=2, enable_caching=True))
    first = make_req("a", 40)
    s.add_request(first)
    run_step(s)
    cached_on = s.kv.pool_of("a")
    while not first.is_finished:
        run_step(s)
    busy = make_req("busy", 60)
    busy.prompt_token_ids = busy.all_token_ids = [500 + i for i in range(60)]  # shares nothing
    s.add_request(busy)
    run_step(s)
    assert s.kv.pool_of("busy") == cached_on  # the tie goes to the same rank: now it is the busier
    s.add_request(make_req("b", 40))  # the same 40 prompt tokens as "a"
    out = s.schedule()
    (new,) = [r for r in out.scheduled_new_reqs if r.req_id == "b"]
    assert new.dp_rank == cached_on and new.num_computed_tokens == 32  # its two cached blocks of 16
