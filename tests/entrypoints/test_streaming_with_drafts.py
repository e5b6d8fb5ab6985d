"""Streaming when a step yields several tokens (accepted drafts): the server's deltas carry all
of them, in order, with one logprob entry each, and add up to the text one token a step gives."""

from __future__ import annotations

import asyncio
import json

import pytest
from scripted_drafts import ScriptedProposer

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tacit import LLM, SamplingParams  # noqa: E402
from tacit.engine.async_engine import AsyncLLMEngine  # noqa: E402
from tacit.engine.llm_engine import LLMEngine  # noqa: E402
from tacit.entrypoints.openai.api_server import build_app  # noqa: E402

PROMPT = [5, 6, 7, 8, 9]
MAX_TOKENS = 14


def test_a_stream_carries_every_accepted_draft(tiny_llama):
    path = str(tiny_llama[2])
    ref = LLM(path, dtype="float32").generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    )
    ref = ref[0].outputs[0]

    def engine_with_drafts() -> LLMEngine:
        engine = LLMEngine(path, dtype="float32")
        engine.runner.drafter = ScriptedProposer({tuple(PROMPT): list(ref.token_ids)}, k=3, wrong=lambda d, j: d == 4)
        return engine

    engine = AsyncLLMEngine(engine_with_drafts)
    engine.start()
    body = {"model": "m", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    body |= {"logprobs": 1, "stream": True}

    async def post() -> str:
        transport = httpx.ASGITransport(app=build_app(engine, "m"))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.text

    try:
        events = [line[6:] for line in asyncio.run(post()).splitlines() if line.startswith("data: {")]
    finally:
        engine.shutdown()
    choices = [json.loads(e)["choices"][0] for e in events]
    tokens = [len(c["logprobs"]["tokens"]) for c in choices if c["logprobs"]]
    assert sum(tokens) == MAX_TOKENS and max(tokens) > 1  # some chunk carried several tokens
    assert "".join(c["text"] for c in choices) == ref.text
    assert choices[-1]["finish_reason"] == "length"
