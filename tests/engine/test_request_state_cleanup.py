"""Nothing kept per request outlives it: once requests end (finished, stopped, aborted running or
waiting, refused, taken down by a failed step), every per-request structure of the engine is
empty, so memory over a long soak does not grow with the request count."""

from __future__ import annotations

import asyncio

import pytest

from tacit import SamplingParams
from tacit.engine.async_engine import AsyncLLMEngine, EngineStepError
from tacit.engine.llm_engine import LLMEngine


def per_request_state(engine: LLMEngine) -> dict[str, int]:
    s = engine.scheduler
    return {
        "scheduler.requests": len(s.requests),
        "scheduler.waiting": len(s.waiting),
        "scheduler.running": len(s.running),
        "scheduler finished ids for the runner": len(s._finished_req_ids),
        "kv block tables": len(s.kv._block_ids),
        "swapped KV blocks (scheduler)": s.swapper.used_blocks if s.swapper is not None else 0,
        "swapped KV (runner)": len(engine.runner.swap_store._stored) if engine.runner.swap_store is not None else 0,
        "runner.requests": len(engine.runner.requests),
        "output_processor parents": len(engine.output_processor._parents),
        "output_processor sequences": len(engine.output_processor._parent_of),
    }


def assert_empty(engine: LLMEngine) -> None:
    state = per_request_state(engine)
    assert not any(state.values()), state


def test_offline_requests_leave_nothing_behind(tiny_llama):
    # A small pool and batch, so requests wait, get preempted and swapped too.
    engine = LLMEngine(str(tiny_llama[2]), dtype="float32", num_kv_blocks=12, block_size=4, max_num_seqs=4)
    kinds = [
        SamplingParams(temperature=0.8, max_tokens=5),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, n=3, seed=1),
        SamplingParams(temperature=0.0, max_tokens=20, stop=["e", "a", " "]),
        SamplingParams(temperature=0.0, max_tokens=8, logprobs=2),
    ]
    ids = [engine.add_request(f"Paris {i} is the", kinds[i % len(kinds)]) for i in range(40)]
    with pytest.raises(ValueError):
        engine.add_request([10**6], kinds[0])  # refused: nothing of it may stay
    engine.step()
    engine.step()
    for rid in ids[::5]:  # some running, some still waiting
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    engine.abort_request(ids[1])  # already finished: a no-op
    assert_empty(engine)
    assert engine.scheduler.kv.num_used_blocks == 0


def test_idle_abort_hands_the_runner_its_state_back(tiny_llama):
    engine = LLMEngine(str(tiny_llama[2]), dtype="float32")
    rid = engine.add_request("Hello", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert len(engine.runner.requests) == 1
    engine.abort_request(rid)  # no step follows: the runner must still drop it now
    assert_empty(engine)


def test_served_requests_leave_nothing_behind(tiny_llama):
    engine = AsyncLLMEngine(lambda: LLMEngine(str(tiny_llama[2]), dtype="float32", max_num_seqs=4))
    engine.start()
    real_step, calls = engine.engine.step_in_layers, {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("injected")
        return (yield from real_step())

    engine.engine.step_in_layers = flaky_step
    params = SamplingParams(temperature=0.8, max_tokens=6)

    async def one(i: int) -> str:
        try:
            async for out in engine.generate(f"Paris {i}", params):
                if i % 4 == 0:
                    break  # the client goes away mid-stream: generate's finally aborts it
            return "ok"
        except EngineStepError:
            return "failed"

    async def main() -> list[str]:
        results = await asyncio.gather(*(one(i) for i in range(24)))
        for _ in range(300):  # aborts are applied by the engine thread between steps
            if not engine._streams and not any(per_request_state(engine.engine).values()):
                break
            await asyncio.sleep(0.01)
        return results

    try:
        results = asyncio.run(main())
        assert "failed" in results and "ok" in results
        assert not engine._streams
        assert_empty(engine.engine)
    finally:
        engine.shutdown()
