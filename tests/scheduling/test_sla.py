"""The sla policy: slack order, admission that refuses (or defers) what cannot meet its TTFT,
the cost model it estimates with, and clear errors for bad targets."""

import pytest

from tacit import LLM, SamplingParams
from tacit.config import SchedulerConfig, parse_slo_class
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.policy import get_policy
from tacit.scheduling.scheduler import Scheduler
from tacit.scheduling.sla import SLOUnattainableError

from helpers import FakeClock, make_req, run_step


def sla_scheduler(clock: FakeClock, **cfg) -> Scheduler:
    kv = PagedKVCacheManager(num_blocks=1024, block_size=4)
    return Scheduler(SchedulerConfig(policy="sla", **cfg), kv, get_policy("sla"), clock=clock)


def teach(cost: StepCostModel, per_token: float = 0.001, per_decode: float = 0.002, base: float = 0.01) -> None:
    for p, d in [(0, 1), (0, 8), (100, 0), (300, 4), (50, 16), (1000, 2)] * 5:
        cost.observe(p, d, base + per_decode * d + per_token * p)


def test_cost_model_recovers_step_costs_from_observations():
    cost = StepCostModel()
    assert cost.prefill_s_per_token == 0.0 and cost.step_s(100, 4) == 0.0  # nothing measured: admit all
    teach(cost)
    assert cost.prefill_s_per_token == pytest.approx(0.001, rel=1e-3)
    assert cost.step_s(0, 10) == pytest.approx(0.03, rel=1e-3)
    assert cost.prefill_s(1000, 500, 0) == pytest.approx(2 * 0.01 + 1.0, rel=1e-3)  # two chunked steps


def test_sla_orders_by_slack_then_untargeted_then_late():
    clock = FakeClock()
    s = sla_scheduler(clock, max_num_seqs=1)
    teach(s.cost)
    s.add_request(make_req("loose", 8, arrival=0.0, ttft_ms=10_000))
    s.add_request(make_req("none", 8, arrival=0.0))
    s.add_request(make_req("tight", 8, arrival=0.5, ttft_ms=1_000))
    order = []
    while s.waiting or s.running:
        clock.t += 0.1
        order += [r for r in run_step(s) if r not in order]
    assert order == ["tight", "loose", "none"]

    s = sla_scheduler(clock, max_num_seqs=1)
    teach(s.cost)
    clock.t = 100.0
    s.add_request(make_req("late", 8, arrival=90.0, ttft_ms=1_000))  # its deadline passed at 91
    s.add_request(make_req("none", 8, arrival=100.0))
    assert run_step(s) == ["none"]  # a lost cause waits behind work that can still count


def test_sla_admission_rejects_with_target_and_estimate():
    clock = FakeClock()
    s = sla_scheduler(clock)
    teach(s.cost)  # 1 ms a prefill token
    s.add_request(make_req("big", 2000, ttft_ms=10_000))
    s.add_request(make_req("fits", 10, ttft_ms=5_000))
    run_step(s)  # big prefills its first 512 tokens (long_prefill_token_threshold); 1488 remain
    # An earlier deadline puts it first in the queue, but a running prefill is still ahead of it.
    with pytest.raises(SLOUnattainableError) as e:
        s.add_request(make_req("urgent", 10, ttft_ms=100))
    msg = str(e.value)
    assert "ttft_slo_ms=100" in msg and "estimates 1512 ms" in msg and "1488 queued ahead" in msg, msg
    s.add_request(make_req("patient", 10, ttft_ms=2_000))
    assert [r.request_id for r in s.waiting] == ["patient"]  # nothing of "urgent" left behind


def test_sla_defer_queues_a_late_request_behind_on_time_work():
    clock = FakeClock()
    s = sla_scheduler(clock, slo_admission="defer", max_num_seqs=1)
    teach(s.cost)
    s.add_request(make_req("big", 2000, ttft_ms=10_000))
    order = run_step(s)
    s.add_request(make_req("urgent", 10, ttft_ms=100))  # 1488 prefill tokens ahead: ~1.5 s
    assert s.waiting[0].slo_deferred
    s.add_request(make_req("ok", 10, ttft_ms=60_000))
    while s.waiting or s.running:
        clock.t += 0.1
        order += [r for r in run_step(s) if r not in order]
    assert order == ["big", "ok", "urgent"]


def test_sla_through_llm_names_the_target(tiny_llama):
    llm = LLM(str(tiny_llama[2]), dtype="float32", scheduling_policy="sla", slo_classes={0: {"ttft_ms": 60_000}})
    out = llm.generate(["hello there"], SamplingParams(max_tokens=4, temperature=0.0))  # measures a few steps
    assert len(out[0].outputs[0].token_ids) == 4
    assert llm.engine.scheduler.cost.num_observed > 0
    with pytest.raises(SLOUnattainableError, match=r"ttft_slo_ms=0: the sla policy estimates"):
        llm.generate(["hello there"], SamplingParams(max_tokens=4, ttft_slo_ms=0.0001))
    assert not llm.engine.has_unfinished_requests()
    # The class default applies when the request sets nothing.
    rid = llm.engine.add_request("hi", SamplingParams(max_tokens=2))
    assert llm.engine.scheduler.waiting[0].ttft_slo == 60.0 and llm.engine.scheduler.waiting[0].tpot_slo is None
    llm.engine.abort_request(rid)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(ttft_slo_ms=-5), "SamplingParams.ttft_slo_ms=-5 is invalid: must be milliseconds > 0"),
        (dict(tpot_slo_ms="fast"), "SamplingParams.tpot_slo_ms='fast' is invalid"),
        (dict(expected_output_tokens=0), "SamplingParams.expected_output_tokens=0 is invalid"),
    ],
)
def test_bad_request_targets_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(slo_classes={0: {"ttft_ms": -1}}),
            r"slo_classes\[0\]\['ttft_ms'\]=-1 is invalid: must be milliseconds > 0",
        ),
        (dict(slo_classes={0: {"e2e_ms": 5}}), "key 'e2e_ms' is not known; valid: ttft_ms, tpot_ms"),
        (dict(slo_admission="drop"), "slo_admission='drop' is not known; valid: reject, defer"),
        (dict(preemption_mode="discard"), "preemption_mode='discard' is not known; valid: auto, recompute, swap"),
        (dict(aging_s=-3), "aging_s=-3 is invalid"),
        (dict(long_prefill_token_threshold=-7), "long_prefill_token_threshold=-7 is invalid"),
    ],
)
def test_bad_scheduler_options_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def test_slo_class_flag_parses_and_rejects_garbage():
    assert parse_slo_class("0:ttft=500,tpot=100") == (0, {"ttft_ms": 500.0, "tpot_ms": 100.0})
    with pytest.raises(ValueError, match="write PRIORITY:ttft=MS,tpot=MS"):
        parse_slo_class("interactive")


def test_sla_sizes_steps_to_the_tightest_target():
    clock = FakeClock()
    s = sla_scheduler(clock, slo_classes={0: {"ttft_ms": 1000}}, cut_in_prefill_tokens=0)
    teach(s.cost)  # step = 10 ms + 2 ms a decode + 1 ms a prefill token
    assert s.policy.token_budget(2048, s.view) == 490  # half the class TTFT: 500 ms - 10 ms base
    r = make_req("chat", 4, max_tokens=50)
    r.tpot_slo = 0.1
    s.add_request(r)
    run_step(s)
    # 100 ms TPOT, one decode running: 100 - 12 = 88 ms of prefill, plus the decode itself.
    assert s.policy.token_budget(2048, s.view) == 89
    s.add_request(make_req("big", 1000))
    plan = dict(s.schedule().num_scheduled_tokens)
    assert plan == {"chat": 1, "big": 88}
    s.finish_request(r.request_id, "abort")
    assert s.policy.step_target_s(s.view) == 0.5  # its TPOT no longer counts
    r2 = make_req("hopeless", 4)
    r2.tpot_slo = 0.001  # below a decode-only step (12 ms): missed anyway, so prefill is not throttled
    s.policy.on_start(r2)
    assert s.policy.token_budget(2048, s.view) == 2048


def test_with_cut_in_only_tpot_bounds_the_step():
    s = sla_scheduler(FakeClock(), slo_classes={0: {"ttft_ms": 1000}})  # cut-in on by default
    teach(s.cost)
    assert s.policy.step_target_s(s.view) == float("inf") and s.policy.token_budget(2048, s.view) == 2048
    r = make_req("chat", 4, max_tokens=50)
    r.tpot_slo = 0.1
    s.add_request(r)
    run_step(s)
    assert s.policy.step_target_s(s.view) == 0.1 and s.policy.token_budget(2048, s.view) == 89


def test_sla_late_request_stays_ahead_of_a_lower_class():
    clock = FakeClock()
    s = sla_scheduler(clock, max_num_seqs=1)
    teach(s.cost)
    clock.t = 100.0
    s.add_request(make_req("batch", 8, priority=1, arrival=99.0, ttft_ms=60_000))
    s.add_request(make_req("late-chat", 8, priority=0, arrival=90.0, ttft_ms=500))
    s.add_request(make_req("chat", 8, priority=0, arrival=99.9, ttft_ms=500))
    order = []
    while s.waiting or s.running:
        clock.t += 0.01
        order += [r for r in run_step(s) if r not in order]
    assert order == ["chat", "late-chat", "batch"]


def test_admission_counts_on_cut_in_for_a_request_that_may_cut_in():
    """A queue that would make a short urgent request miss does not refuse it when it can cut
    into the step in flight; the same request with cut-in off is refused."""
    for cut_in, refused in ((256, False), (0, True)):
        s = sla_scheduler(FakeClock(), max_num_seqs=4, cut_in_prefill_tokens=cut_in)
        teach(s.cost)  # 1 ms a prefill token
        s.add_request(make_req("batch", 2000, priority=1))
        run_step(s)  # 512 of its prompt tokens: ~1.5 s of prefill still ahead of anyone queued
        urgent = make_req("chat", 20, priority=0, ttft_ms=200)
        if refused:
            with pytest.raises(SLOUnattainableError, match="ttft_slo_ms=200"):
                s.add_request(urgent)
        else:
            s.add_request(urgent)
            assert s.policy.estimate_ttft(urgent, s.view)[0] < 0.05


def test_admission_counts_only_the_tokens_the_prefix_cache_does_not_hold():
    """A next turn whose 400-token prefix is cached is estimated at its 8 new tokens: admitted
    under a target that the whole prompt would miss, and refused without the cache."""
    clock = FakeClock()
    kv = PagedKVCacheManager(num_blocks=1024, block_size=4, enable_caching=True)
    s = Scheduler(SchedulerConfig(policy="sla"), kv, get_policy("sla"), clock=clock)
    teach(s.cost)
    first = make_req("a", 400)
    s.add_request(first)
    while not first.is_finished:
        run_step(s)
    turn = make_req("b", 408, ttft_ms=150)  # a's 400 tokens and 8 more; 400 tokens alone take ~0.4 s
    assert s.view.uncached_tokens(turn) == 8 and s.policy.estimate_ttft(turn, s.view)[0] < 0.15
    s.add_request(turn)  # admitted
    cold = sla_scheduler(FakeClock())
    teach(cold.cost)
    with pytest.raises(SLOUnattainableError, match="cannot meet its TTFT target"):
        cold.add_request(make_req("b", 408, ttft_ms=150))
