"""AsyncLLMEngine in-process: bad requests come back as errors, a failing step takes down only
the requests in it, aborts free KV blocks, the waiting queue is bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tacit import LLM, SamplingParams  # noqa: E402
from tacit.engine.async_engine import AsyncLLMEngine, EngineStepError, QueueFullError  # noqa: E402
from tacit.engine.llm_engine import LLMEngine  # noqa: E402

from tiny_models import build_hf_model  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("async_llama")
    build_hf_model("llama", path)
    return path


@pytest.fixture
def make_engine(model_dir):
    engines = []

    def make(**kw) -> AsyncLLMEngine:
        max_waiting = kw.pop("max_waiting", 256)
        e = AsyncLLMEngine(lambda: LLMEngine(str(model_dir), dtype="float32", **kw), max_waiting=max_waiting)
        e.start()
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.shutdown()
        assert not e.is_running


async def collect(engine: AsyncLLMEngine, prompt, params=GREEDY):
    out = None
    async for out in engine.generate(prompt, params):
        pass
    return out


def test_generate_matches_llm_and_bad_requests_do_not_kill_the_loop(make_engine, model_dir):
    engine = make_engine()
    ref = LLM(str(model_dir), dtype="float32").generate(["Hello", "Paris"], GREEDY)

    async def main():
        with pytest.raises(ValueError, match="empty"):
            await engine.add_request("", GREEDY)
        with pytest.raises(ValueError, match="out of range"):
            await engine.add_request([10**6], GREEDY)
        return await asyncio.gather(collect(engine, "Hello"), collect(engine, "Paris"))

    outs = asyncio.run(main())
    assert [o.outputs[0].token_ids for o in outs] == [r.outputs[0].token_ids for r in ref]
    assert engine.is_running


def test_failed_step_fails_its_requests_and_the_loop_goes_on(make_engine):
    engine = make_engine()
    real_step, calls = engine.engine.step_in_layers, {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return (yield from real_step())

    engine.engine.step_in_layers = flaky_step

    async def main():
        with pytest.raises(EngineStepError, match="injected"):
            await collect(engine, "Hello")
        return await collect(engine, "Hello")

    out = asyncio.run(main())
    assert out.finished and len(out.outputs[0].token_ids) == 8
    assert engine.engine.get_stats().kv_blocks_used == 0


def test_abort_frees_blocks_and_waiting_queue_is_bounded(make_engine):
    engine = make_engine(max_num_seqs=1, max_waiting=1)
    long = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)

    async def main():
        first = await engine.add_request("Hello", long)
        async for _ in first:
            break  # first is running now
        second = await engine.add_request("Hello", long)  # waits behind it
        with pytest.raises(QueueFullError):
            await engine.add_request("Hello", long)
        engine.abort(first.request_id)
        engine.abort(second.request_id)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if engine.metrics.snapshot.kv_blocks_used == 0 and not engine.engine.has_unfinished_requests():
                return
        raise AssertionError(engine.metrics.snapshot)

    asyncio.run(main())


def test_a_model_that_fails_to_load_raises_from_start(tmp_path):
    engine = AsyncLLMEngine(lambda: LLMEngine(str(tmp_path / "missing")))
    with pytest.raises(FileNotFoundError):
        engine.start()
    assert not engine.is_running
