"""Output-length predictor, shortest-predicted-first, and the aging bound that keeps every
policy from starving anyone."""

import random

import pytest

from tacit import LLM, SamplingParams
from tacit.config import SchedulerConfig
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.scheduling.length_predictor import OutputLengthPredictor
from tacit.scheduling.policy import get_policy
from tacit.scheduling.scheduler import Scheduler

from helpers import FakeClock, advance, make_req, run_step


def test_predictor_learns_and_records_its_error():
    p = OutputLengthPredictor()
    assert p.predict(10, 300, 0.7) == 300  # nothing learned: the only bound it knows
    assert p.predict(10, 300, 0.7, hint=40) == 40
    assert p.mean_abs_error is None
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(5, 200)
        actual = min(2 * n, 512)
        p.observe(n, 512, 0.7, None, p.predict(n, 512, 0.7), actual)
    assert p.num_scored == 300
    assert p.predict(50, 512, 0.7) == pytest.approx(100, rel=0.15)
    assert p.predict(150, 120, 0.7) == 120  # never beyond max_tokens
    early, late = p.mean_abs_error, None
    for _ in range(100):
        n = rng.randint(5, 200)
        p.observe(n, 512, 0.7, None, p.predict(n, 512, 0.7), min(2 * n, 512))
    late = (p.mean_abs_error * 400 - early * 300) / 100
    assert late < early / 3  # the error recorded drops as it learns


def test_predictor_uses_the_client_hint():
    p = OutputLengthPredictor()
    rng = random.Random(1)
    for _ in range(300):
        hint = rng.randint(4, 300)
        p.observe(20, 512, 1.0, hint, p.predict(20, 512, 1.0, hint), hint)
    assert p.predict(20, 512, 1.0, hint=200) == pytest.approx(200, rel=0.1)
    assert p.predict(20, 512, 1.0, hint=10) == pytest.approx(10, rel=0.2)


def test_sjf_runs_shortest_predicted_first_within_a_priority():
    kv = PagedKVCacheManager(num_blocks=256, block_size=4)
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(max_num_seqs=1, policy="sjf"), kv, get_policy("sjf"), clock=clock)
    for rid, pred, prio in [("long", 50, 0), ("short", 2, 0), ("mid", 10, 0), ("urgent-long", 60, -1)]:
        r = make_req(rid, 4, priority=prio, max_tokens=64)
        r.predicted_output_tokens = pred
        s.add_request(r)
    order = []
    while s.waiting or s.running:
        clock.t += 0.01
        order += [r for r in run_step(s) if r not in order]
    assert order == ["urgent-long", "short", "mid", "long"]


@pytest.mark.parametrize("policy", ["priority", "sjf", "sla"])
def test_no_starvation_under_a_flood_of_high_priority_work(policy):
    """A flood that alone fills every batch slot: without aging the low-priority request never
    runs; with aging_s=5 it runs once it has waited 5 s and is not preempted again."""

    def run(aging_s):
        clock = FakeClock()
        kv = PagedKVCacheManager(num_blocks=512, block_size=4)
        s = Scheduler(
            SchedulerConfig(max_num_seqs=2, policy=policy, aging_s=aging_s), kv, get_policy(policy), clock=clock
        )
        low = make_req("low", 4, priority=9, max_tokens=4, arrival=0.0)
        s.add_request(low)
        started = None
        for step in range(60):
            clock.t = step * 1.0
            for k in range(2):  # two urgent requests a second, each holding a slot for 3 steps
                s.add_request(make_req(f"hi-{step}-{k}", 4, priority=0, max_tokens=3, arrival=clock.t, ttft_ms=2_000))
            ran = run_step(s, now=clock.t)
            if "low" in ran and started is None:
                started = clock.t
            if low.is_finished:
                return started, clock.t, low.num_preemptions
        return started, None, low.num_preemptions

    assert run(aging_s=None)[1] is None  # strict order: starved for all 60 s
    started, finished, preemptions = run(aging_s=5.0)
    # It runs once a slot frees after it has aged (slots turn over every 3 steps) and keeps it.
    assert 5.0 <= started <= 5.0 + 3 and finished <= started + 4 and preemptions == 0


def test_engine_scores_the_predictor_on_finished_requests(tiny_llama):
    llm = LLM(str(tiny_llama[2]), dtype="float32", scheduling_policy="sjf")
    params = [SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0) for m in (3, 9, 5, 7)]
    llm.generate([[5, 6, 7]] * 4, params)
    stats = llm.engine.get_stats()
    # Nothing had finished when they arrived, so each was predicted at max_tokens, which ignore_eos hits.
    assert stats.length_predictor_scored == 4 and stats.length_predictor_mae == 0.0
    # An aborted request says nothing about the length it would have had.
    rid = llm.engine.add_request([5, 6], SamplingParams(max_tokens=50))
    llm.engine.step()
    llm.engine.abort_request(rid)
    assert llm.engine.get_stats().length_predictor_scored == 4


def test_long_prompt_is_prefilled_in_bounded_chunks_beside_decodes():
    kv = PagedKVCacheManager(num_blocks=512, block_size=4)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=1024, long_prefill_token_threshold=128), kv)
    s.add_request(make_req("chat", 4, max_tokens=20))
    run_step(s)
    s.add_request(make_req("long", 600, max_tokens=2))
    chunks = []
    while s.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in s.running):
        out = s.schedule()
        plan = dict(out.num_scheduled_tokens)
        assert plan.get("chat") == 1  # the decode goes on every step
        chunks.append(plan["long"])
        advance(s, out)
    assert chunks == [128, 128, 128, 128, 88]


def test_chunk_cap_keeps_tokens_identical(tiny_llama):
    path = str(tiny_llama[2])
    prompts = [[9] * 300, [5, 6, 7], [11] * 40]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ref = [
        o.outputs[0].token_ids
        for o in LLM(path, dtype="float32", long_prefill_token_threshold=0).generate(prompts, params)
    ]
    capped = LLM(path, dtype="float32", long_prefill_token_threshold=32).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in capped] == ref


def test_one_long_prompt_prefills_at_a_time_and_short_ones_pass_it():
    kv = PagedKVCacheManager(num_blocks=1024, block_size=4)
    s = Scheduler(
        SchedulerConfig(max_num_batched_tokens=2048, long_prefill_token_threshold=128, max_long_partial_prefills=1), kv
    )
    for rid in ("long-a", "long-b"):
        s.add_request(make_req(rid, 300, max_tokens=2))
    s.add_request(make_req("short", 20, max_tokens=2))
    plans = []
    while s.waiting or s.running:
        out = s.schedule()
        plans.append(dict(out.num_scheduled_tokens))
        advance(s, out)
    # long-b waits until long-a is down to its last 44 tokens (no longer "long"); short never waits.
    assert plans[0] == {"long-a": 128, "short": 20}
    assert plans[1] == {"long-a": 128, "short": 1}
    assert plans[2] == {"long-a": 44, "long-b": 128}
    assert max(sum(n for r, n in p.items() if r.startswith("long")) for p in plans) <= 128 + 44
    with pytest.raises(ValueError, match="max_long_partial_prefills=0 is invalid"):
        SchedulerConfig(max_long_partial_prefills=0)
