"""Cache-aware scheduling: preemption for blocks passes over a victim whose blocks are all shared
(preemption.pick_victim_for_blocks)."""

from __future__ import annotations

from tacit.config import SchedulerConfig
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.sampling_params import SamplingParams
from tacit.scheduling import preemption
from tacit.scheduling.policy import FCFSPolicy, PriorityPolicy
from tacit.scheduling.request import Request, RequestStatus
from tacit.scheduling.scheduler import Scheduler

from helpers import FakeClock


def _req(rid: str, tokens: list[int], arrival: float, priority: int = 0, max_tokens: int = 4) -> Request:
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=max_tokens),
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=arrival,
    )


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
        hit = kv.get_block_ids("old") if rid == "new" else None
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
