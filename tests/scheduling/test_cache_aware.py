"""Cache-aware scheduling: the waiting queue goes longest cached prefix first among requests the
policy ranks equal up to arrival (tacit/scheduling/prefix_order.py), and preemption for blocks
passes over a victim whose blocks are all shared (preemption.pick_victim_for_blocks)."""

from __future__ import annotations

import pytest

from tacit.cli import build_parser
from tacit.config import SchedulerConfig
from tacit.config.engine_args import EngineArgs
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.sampling_params import SamplingParams
from tacit.scheduling import preemption
from tacit.scheduling.policy import FCFSPolicy, PriorityPolicy, SJFPolicy
from tacit.scheduling.prefix_order import LPM_MAX_WAITING
from tacit.scheduling.request import Request, RequestStatus
from tacit.scheduling.scheduler import Scheduler

from helpers import FakeClock, run_step

PREFIX = list(range(100, 112))  # 3 full blocks of 4


def _req(rid: str, tokens: list[int], arrival: float, priority: int = 0, max_tokens: int = 4) -> Request:
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=max_tokens),
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=arrival,
    )


def _cold(rid: str, arrival: float, priority: int = 0) -> Request:
    return _req(rid, [1000 + sum(map(ord, rid))] * 14, arrival, priority)


def _hot(rid: str, arrival: float, priority: int = 0) -> Request:
    return _req(rid, PREFIX + [7, 8], arrival, priority)


def _scheduler(policy=None, caching: bool = True, **config) -> Scheduler:
    """One request a step (max_num_seqs=1), with PREFIX's 3 blocks in the prefix cache."""
    clock = FakeClock()
    kv = PagedKVCacheManager(num_blocks=256, block_size=4, enable_caching=caching)
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, **config), kv, policy, clock)
    s.add_request(_req("seed", PREFIX + [1], arrival=0.0, max_tokens=1))
    assert run_step(s) == ["seed"] and not s.has_unfinished_requests()
    clock.t = 10.5
    return s


def test_the_longest_cached_prefix_goes_first_among_equals():
    s = _scheduler()
    s.add_request(_cold("a", 10.0))
    s.add_request(_hot("b", 10.2))  # arrived after a, in the same second
    assert run_step(s) == ["b"]
    assert s.requests["b"].num_cached_tokens == 12


def test_off_by_knob_or_without_the_cache_arrival_order_holds():
    for s in (_scheduler(enable_cache_aware_scheduling=False), _scheduler(caching=False)):
        s.add_request(_cold("a", 10.0))
        s.add_request(_hot("b", 10.2))
        assert run_step(s) == ["a"]


@pytest.mark.parametrize("num_cold", [LPM_MAX_WAITING - 1, LPM_MAX_WAITING])
def test_above_the_cutoff_arrival_order_holds(num_cold):
    s = _scheduler()
    for i in range(num_cold):
        s.add_request(_cold(f"a{i}", 10.0 + i * 1e-4))
    s.add_request(_hot("b", 10.2))
    # LPM_MAX_WAITING waiting: ranked, the hit goes first; one more: arrival order.
    assert run_step(s) == (["b"] if num_cold + 1 <= LPM_MAX_WAITING else ["a0"])


def test_an_aged_request_still_goes_first():
    s = _scheduler(aging_s=0.4)
    s.add_request(_cold("a", 10.0))  # waited 0.5 s at 10.5: aged
    s.add_request(_hot("b", 10.2))  # 0.3 s: not
    assert run_step(s) == ["a"]


def test_only_requests_of_the_same_arrival_window_are_reordered():
    """The starvation bound: a cold request is passed only by those arriving in its second."""
    s = _scheduler()
    s.add_request(_cold("a", 9.9))
    s.add_request(_hot("b", 10.1))
    assert run_step(s) == ["a"]


def test_a_resuming_request_is_not_pushed_behind_hits():
    s = _scheduler()
    s.add_request(_cold("a", 10.0))
    s.waiting[0].status = RequestStatus.PREEMPTED  # as Scheduler._preempt leaves it
    s.add_request(_hot("b", 10.2))
    assert run_step(s) == ["a"]


def test_priority_outranks_the_cached_prefix_and_sjf_keeps_its_own_order():
    s = _scheduler(PriorityPolicy())
    s.add_request(_hot("b", 10.0, priority=5))
    s.add_request(_cold("a", 10.2, priority=0))
    assert run_step(s) == ["a"]
    s = _scheduler(PriorityPolicy())
    s.add_request(_cold("a", 10.0, priority=3))
    s.add_request(_hot("b", 10.2, priority=3))
    assert run_step(s) == ["b"]
    s = _scheduler(SJFPolicy())  # same predicted length: sjf goes by arrival, not by the cache
    s.add_request(_cold("a", 10.0, priority=3))
    s.add_request(_hot("b", 10.2, priority=3))
    assert run_step(s) == ["a"]


# ---- preemption -----------------------------------------------------------------------------


def _running(policy, priorities=(0, 0, 0)) -> tuple[Scheduler, dict[str, Request]]:
    """A full pool of 4 blocks: "old" holds 2, "mid" 2 of its own, and "new" (the newest) only
    old's 2, shared. Each has 8 tokens computed and one to go, so old's next token needs a block."""
    kv = PagedKVCacheManager(num_blocks=4, block_size=4, enable_caching=True)
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), kv, policy, FakeClock())
    reqs = {}
    for (rid, prio), t in zip(zip(("old", "mid", "new"), priorities), (1.0, 2.0, 3.0)):
        r = _req(rid, [t] * 8, arrival=t, priority=prio, max_tokens=8)
        r.append_output_token(7)
        r.status, r.num_computed_tokens = RequestStatus.RUNNING, 8
        hit = kv.get_block_ids("old")[0] if rid == "new" else None
        assert kv.allocate_slots(rid, 8, 0, hit) is not None
        s.requests[rid] = r
        s.running.append(r)
        reqs[rid] = r
    assert kv.num_free_blocks == 0
    assert [kv.num_unshared_blocks(r) for r in ("old", "mid", "new")] == [0, 2, 0]  # old's are shared with new
    return s, reqs


def test_preemption_skips_a_victim_that_would_free_nothing():
    s, reqs = _running(FCFSPolicy())
    out = s.schedule()
    # fcfs's victim is the newest, whose blocks are all old's: preempting it frees nothing.
    assert out.preempted_req_ids == ["mid"] and s.num_preemptions == 1
    assert {r.request_id for r in s.running} == {"old", "new"}
    assert set(out.num_scheduled_tokens) == {"old", "new"}  # mid's 2 blocks were enough for both


def test_preemption_keeps_priority_order_even_when_the_victim_frees_nothing():
    s, reqs = _running(PriorityPolicy(), priorities=(0, 0, 5))
    cands = list(reqs.values())
    # "new" alone is of the lowest priority: it goes first although it frees nothing.
    assert preemption.pick_victim_for_blocks(s, cands, reqs["old"]) is reqs["new"]
    s, reqs = _running(PriorityPolicy(), priorities=(0, 3, 3))
    assert preemption.pick_victim_for_blocks(s, list(reqs.values()), reqs["old"]) is reqs["mid"]


def test_the_request_needing_room_yields_rather_than_take_from_someone_ranked_below_it():
    s, reqs = _running(FCFSPolicy())
    # For "new"'s room: new is fcfs's victim and frees nothing, but it is the requester itself:
    # it yields, rather than preempt the older "mid".
    assert preemption.pick_victim_for_blocks(s, [reqs["mid"], reqs["new"]], reqs["new"]) is reqs["new"]
    # For a batch slot every victim frees one: the policy's order alone.
    assert preemption.pick_victim(s, list(reqs.values())) is reqs["new"]


def test_the_knob_from_the_cli_and_its_validation():
    for argv, want in ((["serve"], True), (["serve", "--no-enable-cache-aware-scheduling"], False)):
        args = EngineArgs.from_cli_args(build_parser().parse_args(argv))
        assert args.create_scheduler_config().enable_cache_aware_scheduling is want
    with pytest.raises(ValueError, match="enable_cache_aware_scheduling='yes' is invalid"):
        SchedulerConfig(enable_cache_aware_scheduling="yes")
