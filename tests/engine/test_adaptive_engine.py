"""AsyncLLMEngine(adaptive=...) on a tiny random model: requests are served, the controller's
decisions reach the scheduler's config between steps, and /metrics counts them."""

from __future__ import annotations

import asyncio
import re

import pytest

from tacit import SamplingParams
from tacit.engine.async_engine import AsyncLLMEngine
from tacit.scheduling import adaptive
from tacit.scheduling.adaptive import AdaptiveBounds

PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def test_adaptive_engine_serves_and_counts_its_decisions(tiny_llama, monkeypatch, caplog):
    # A tiny model steps in ~1-5 ms: a 20 ms interval lets a test of a second or two see decisions.
    monkeypatch.setattr(adaptive, "MIN_INTERVAL_S", 0.02)
    # Steps of 1-5 ms timed on a loaded 2-core CI fit a per-token prefill cost of 0 (noise,
    # clipped), and a controller with no cost per token has no budget to move to: a clean-clone
    # CI saw no decision at all. The step times it learns from are a fixed function of the step's
    # shape here; this test is about the decisions reaching the scheduler and /metrics (the
    # controller's arithmetic: tests/scheduling/test_adaptive.py).
    observe = adaptive.AdaptiveController.observe

    def steady(self, step_seconds, num_prefill_tokens, num_decode_rows, *args, **kwargs):
        step = 1e-3 + 2e-5 * num_prefill_tokens + 1e-4 * num_decode_rows
        return observe(self, step, num_prefill_tokens, num_decode_rows, *args, **kwargs)

    monkeypatch.setattr(adaptive.AdaptiveController, "observe", steady)
    engine = AsyncLLMEngine.from_engine_args(
        adaptive=AdaptiveBounds(tpot_ms=1000.0),
        model=str(tiny_llama[2]),
        dtype="float32",
        max_num_seqs=2,
        max_num_batched_tokens=64,
        long_prefill_token_threshold=32,
    )
    engine.start()
    try:
        bounds = engine.adaptation.bounds
        assert (bounds.min_batched_tokens, bounds.max_batched_tokens) == (64, 256)  # the floor: at most configured

        async def one(i: int):
            out = None
            async for out in engine.generate(list(range(1, 161 + i)), PARAMS):
                pass
            return out

        async def main():
            return await asyncio.gather(*(one(i) for i in range(16)))

        with caplog.at_level("INFO", logger="tacit.engine.adaptive"):
            outs = asyncio.run(main())
        assert all(len(o.outputs[0].token_ids) == 24 and o.finished for o in outs)
        # The last step's outputs are delivered before the controller sees that step: stop the
        # engine thread so that nothing moves while the state is read.
        engine.shutdown()

        controller = engine.adaptation.controller
        config = engine.engine.scheduler.config
        # What the controller last decided is what the scheduler runs with (the budget went up while
        # 14 requests queued behind 2 slots, and may have come back to 64 once they drained).
        assert (config.max_num_batched_tokens, config.long_prefill_token_threshold) == (
            controller.budget,
            controller.cap,
        )
        text = engine.metrics.render_prometheus("tiny")
        counts = {
            (m[1], m[2]): int(m[3])
            for m in re.finditer(
                r'tacit_adaptive_decisions_total\{model_name="tiny",knob="(\w+)",direction="(up|down)"\} (\d+)', text
            )
        }
        # 14 requests queued behind 2 slots, steps far under a 1 s TPOT: the budget went up.
        assert len(counts) == 4 and counts["max_num_batched_tokens", "up"] >= 1
        assert f'tacit_adaptive_max_num_batched_tokens{{model_name="tiny"}} {controller.budget}' in text
        assert f'tacit_adaptive_long_prefill_token_threshold{{model_name="tiny"}} {controller.cap}' in text
        logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("adaptive: ")]
        assert len(logged) == sum(counts.values()) and "max_num_batched_tokens up" in "".join(logged)
    finally:
        engine.shutdown()


def test_adaptive_bounds_the_engine_cannot_run_fail_start(tiny_llama):
    engine = AsyncLLMEngine.from_engine_args(adaptive=AdaptiveBounds(), model=str(tiny_llama[2]), dtype="float32")
    with pytest.raises(ValueError, match="needs a TPOT target"):
        engine.start()
    engine.shutdown()  # the engine was built before the bounds were checked against it


def test_without_adaptive_metrics_carry_no_adaptive_lines(tiny_llama):
    engine = AsyncLLMEngine.from_engine_args(model=str(tiny_llama[2]), dtype="float32")
    engine.start()
    try:
        assert engine.adaptation is None and "tacit_adaptive" not in engine.metrics.render_prometheus("tiny")
    finally:
        engine.shutdown()
