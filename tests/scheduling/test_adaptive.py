"""The adaptive controller (tacit/scheduling/adaptive.py) on synthetic steps: budget up on a long
queue of fast steps, down when a step would miss the TPOT target, within its bounds, without
flapping, no more often than its minimum interval; and the scheduler's config replaced between
steps."""

import random

import pytest

from tacit.config import SchedulerConfig
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.scheduling.adaptive import (
    MIN_INTERVAL_S,
    MIN_OBSERVED,
    REVERSAL_HOLD_S,
    AdaptiveBounds,
    AdaptiveController,
)
from tacit.scheduling.policy import get_policy
from tacit.scheduling.scheduler import Scheduler

from helpers import advance, make_req, run_step

# A synthetic machine: 10 ms a step, 1 ms a decode row, `per_token` seconds a prompt token.
BASE, PER_ROW = 0.010, 0.001
# Step shapes that vary both prompt tokens and rows, so the three-term fit is determined.
SHAPES = [(0, 8), (128, 8), (256, 6), (512, 8), (64, 7), (384, 8)]


def controller(budget=512, cap=256, tpot_ms=200.0, **bounds) -> AdaptiveController:
    cfg = SchedulerConfig(max_num_batched_tokens=budget, long_prefill_token_threshold=cap)
    return AdaptiveController(AdaptiveBounds(tpot_ms=tpot_ms, **bounds).resolve(cfg), budget, cap)


def feed(c, t0, steps, per_token, waiting, running=8, long=0, noise=0.0, rng=None, dt=0.05):
    """Observe `steps` steps from t0, dt apart; waiting: an int or a list cycled over. Returns
    the time after the last one and every decision taken on the way."""
    decisions, t = [], t0
    for i in range(steps):
        prefill, rows = SHAPES[i % len(SHAPES)]
        seconds = BASE + PER_ROW * rows + per_token * prefill
        if noise:
            seconds *= 1 + rng.uniform(-noise, noise)
        w = waiting[i % len(waiting)] if isinstance(waiting, list) else waiting
        c.observe(seconds, prefill, rows, w, running, t, num_long_prefills=long)
        d = c.decide(t)
        if d is not None:
            decisions.append((t, d))
        t += dt
    return t, decisions


def test_long_queue_of_fast_steps_raises_the_budget_to_what_meets_tpot():
    c = controller()
    _, decisions = feed(c, 0.0, 40, per_token=0.0001, waiting=20)
    (_, d), *rest = decisions
    assert not rest
    assert d.moves == (("max_num_batched_tokens", "up"),)
    # P* = (0.9 * 200 - 10 - 8) ms / 0.1 ms = 1620, B* = 8 + 1620 -> 1616 (a multiple of 16).
    assert d.max_num_batched_tokens == 1616 and c.budget == 1616
    assert c.cost.step_s(d.max_num_batched_tokens - 8, 8) <= 0.9 * 0.2
    assert "best budget 1616" in d.reason and "TPOT 200 ms" in d.reason


def test_tpot_over_target_lowers_the_budget_even_with_nobody_waiting():
    c = controller(budget=2048, cap=512)
    _, decisions = feed(c, 0.0, 40, per_token=0.001, waiting=0)
    (_, d), *rest = decisions
    assert not rest
    assert d.moves == (("max_num_batched_tokens", "down"),)
    # P* = (180 - 18) / 1 = 162, B* = 170 -> 160: below the floor, so the floor (256).
    assert d.max_num_batched_tokens == 256


def test_no_budget_move_when_the_decodes_alone_miss_the_target():
    c = controller(budget=2048, cap=512, tpot_ms=10.0)  # 10 ms + 8 rows = 18 ms > 9 ms
    _, decisions = feed(c, 0.0, 40, per_token=0.001, waiting=20)
    assert decisions == [] and c.best_budget() is None


def test_bounds_are_respected_and_checked():
    up = controller(min_batched_tokens=300, max_batched_tokens=700)
    _, [(_, d)] = feed(up, 0.0, 40, per_token=0.0001, waiting=20)
    assert d.max_num_batched_tokens == 700
    down = controller(budget=2048, cap=512, min_batched_tokens=300, max_batched_tokens=4096)
    _, [(_, d)] = feed(down, 0.0, 40, per_token=0.001, waiting=0)
    assert d.max_num_batched_tokens == 300

    cfg = SchedulerConfig(max_num_batched_tokens=512, long_prefill_token_threshold=256)
    b = AdaptiveBounds(tpot_ms=100).resolve(cfg)
    assert (b.min_batched_tokens, b.max_batched_tokens, b.min_long_prefill, b.max_long_prefill) == (256, 2048, 128, 512)
    with pytest.raises(ValueError, match="min-batched-tokens=900 is above --adaptive-max-batched-tokens=800"):
        AdaptiveBounds(tpot_ms=100, min_batched_tokens=900, max_batched_tokens=800).resolve(cfg)
    with pytest.raises(ValueError, match="needs a TPOT target"):
        AdaptiveBounds().resolve(cfg)
    with pytest.raises(ValueError, match="above max_num_batched_tokens=512"):
        AdaptiveBounds(tpot_ms=100, max_long_prefill=1024).resolve(cfg)
    with pytest.raises(ValueError, match="tpot-ms=-1"):
        AdaptiveBounds(tpot_ms=-1).resolve(cfg)
    with pytest.raises(ValueError, match="needs chunked prefill"):
        AdaptiveBounds(tpot_ms=100).resolve(SchedulerConfig(enable_chunked_prefill=False))
    with pytest.raises(ValueError, match="streamed-expert cache"):
        AdaptiveBounds(tpot_ms=100, max_batched_tokens=1024).resolve(cfg, budget_ceiling=512)
    # The TPOT target from the slo_classes: the tightest one.
    slo = SchedulerConfig(slo_classes={0: {"tpot_ms": 150}, 1: {"ttft_ms": 900, "tpot_ms": 400}})
    assert AdaptiveBounds().resolve(slo).tpot_ms == 150
    # No cap configured: the cap does not move and the budget may not grow past the configured one.
    nocap = AdaptiveBounds(tpot_ms=100).resolve(SchedulerConfig(long_prefill_token_threshold=0))
    assert (nocap.min_long_prefill, nocap.max_long_prefill, nocap.max_batched_tokens) == (0, 0, 2048)
    with pytest.raises(ValueError, match="resolved bounds"):
        AdaptiveController(AdaptiveBounds(tpot_ms=100), 512, 256)


def test_cap_shrinks_behind_a_long_prompt_and_grows_back_when_the_queue_drains():
    # A TPOT target loose enough, and the budget at its ceiling: only the cap moves.
    c = controller(budget=512, cap=512, tpot_ms=1000.0, max_batched_tokens=512)
    t, decisions = feed(c, 0.0, 40, per_token=0.0001, waiting=6, long=1)
    (_, d), *rest = decisions
    assert not rest and d.moves == (("long_prefill_token_threshold", "down"),)
    # Half of what the step has for prefill: (512 - 8) / 2 = 252 -> 240 (a multiple of 16).
    assert d.long_prefill_token_threshold == 240 and d.max_num_batched_tokens == 512
    assert "1 prompt(s) over the 512-token cap" in d.reason
    _, decisions = feed(c, t, 60, per_token=0.0001, waiting=0)
    (_, d), *rest = decisions
    assert not rest and d.moves == (("long_prefill_token_threshold", "up"),)
    assert d.long_prefill_token_threshold == 512 and "cap back to 512" in d.reason


def test_budget_returns_to_the_configured_value_when_the_queue_drains():
    c = controller()
    t, [(_, up)] = feed(c, 0.0, 40, per_token=0.0001, waiting=20)
    assert up.max_num_batched_tokens > 512
    _, [(_, down)] = feed(c, t, 60, per_token=0.0001, waiting=0)
    assert down.moves == (("max_num_batched_tokens", "down"),) and down.max_num_batched_tokens == 512
    assert "queue drained" in down.reason


def test_no_flapping_on_alternating_queue_or_noisy_steps():
    c = controller()
    # A queue that is empty every other step averages ~10: long, every time. One move, up, then none.
    _, decisions = feed(c, 0.0, 400, per_token=0.0001, waiting=[0, 20])
    assert [d.moves for _, d in decisions] == [(("max_num_batched_tokens", "up"),)]
    # Step times +-10% at random under a steady queue: the first move, then nothing for 20 s.
    c = controller()
    _, decisions = feed(c, 0.0, 400, per_token=0.0001, waiting=20, noise=0.1, rng=random.Random(0))
    assert len(decisions) == 1


def test_decisions_wait_for_enough_steps_and_the_minimum_interval():
    c = controller()
    t, decisions = feed(c, 0.0, MIN_OBSERVED - 1, per_token=0.0001, waiting=20, dt=1.0)
    assert decisions == []  # a second apart, but too few steps to fit
    t, [(t_up, _)] = feed(c, t, 1, per_token=0.0001, waiting=20)
    # The load turns at once (prompt tokens 20x dearer, nobody waiting); the next decision still
    # waits MIN_INTERVAL_S after the last one.
    _, decisions = feed(c, t, 200, per_token=0.002, waiting=0, dt=0.01)
    assert decisions and decisions[0][0] - t_up >= MIN_INTERVAL_S
    assert all(b[0] - a[0] >= MIN_INTERVAL_S for a, b in zip(decisions, decisions[1:]))
    assert decisions[0][1].moves == (("max_num_batched_tokens", "down"),)


def test_the_scheduler_sees_a_replaced_config_on_its_next_schedule():
    kv = PagedKVCacheManager(num_blocks=256, block_size=4)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=0), kv, get_policy("sla"))
    s.add_request(make_req("a", 200))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 64}
    s.replace_config(max_num_batched_tokens=32)
    advance(s, out)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 32}  # the policy's token_budget got the new budget
    advance(s, out)
    s.replace_config(long_prefill_token_threshold=8)
    s.add_request(make_req("b", 4))
    assert run_step(s) == ["a", "b"] and s.requests["a"].num_computed_tokens == 104  # 64 + 32 + 8 (the cap)
    with pytest.raises(ValueError, match="max_num_batched_tokens=0 is invalid"):
        s.replace_config(max_num_batched_tokens=0)
    assert s.config.max_num_batched_tokens == 32 and s.config.long_prefill_token_threshold == 8


def test_a_cap_above_the_budget_comes_down_when_the_budget_grows():
    # Configured cap 512 over a 64-token budget: the budget bounded every chunk. Grown to 256,
    # one request's chunk may not pass 64, what the KV cache was sized for.
    c = controller(budget=64, cap=512, tpot_ms=200.0)
    assert (c.bounds.min_long_prefill, c.bounds.max_long_prefill) == (64, 64)
    _, [(_, d)] = feed(c, 0.0, 40, per_token=0.0001, waiting=20)
    assert d.max_num_batched_tokens == 256 and d.long_prefill_token_threshold == 64
    assert d.moves == (("max_num_batched_tokens", "up"), ("long_prefill_token_threshold", "down"))


def test_a_budget_brought_down_waits_before_going_up_again():
    # Prompt tokens 10x dearer every other 1.2 s (a noisy machine): the fit swings each phase.
    c = controller()
    t, decisions = 0.0, []
    for phase in range(10):
        t, got = feed(c, t, 24, per_token=0.001 if phase % 2 else 0.0001, waiting=20)
        decisions += got
    moves = [(when, d.moves[0][1]) for when, d in decisions]
    assert moves[0][1] == "up" and ("down" in dict(moves).values())
    for (when, move), (later, next_move) in zip(moves, moves[1:]):
        if move == "down" and next_move == "up":
            assert later - when >= REVERSAL_HOLD_S
    assert len(moves) <= 4  # 12 s of swings: up, down, and at most one more round
