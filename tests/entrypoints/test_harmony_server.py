"""The harmony format through the server with the official `openai` client (issue 36's done-when):
a tiny model whose tokenizer has harmony's special tokens, its output scripted
(tests/scripted_output.py), asked for a tool call, given the result, answering — whole and
streamed; `reasoning_content` apart from `content`; reasoning_effort reaching the template.

Until a tiny gpt-oss exists the model is a tiny llama and the app is built with vLLM's
--tool-call-parser openai (tests/tiny_harmony.py: ARCH, SERVER_FLAGS say how to switch)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_output import script_sampling
from tiny_harmony import SERVER_FLAGS, build_harmony_model

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from tacit.bench.launch import free_port  # noqa: E402
from tacit.engine.async_engine import AsyncLLMEngine  # noqa: E402
from tacit.engine.llm_engine import LLMEngine  # noqa: E402
from tacit.entrypoints.openai.api_server import build_app  # noqa: E402
from tacit.tokenizer import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CALL = (
    "<|channel|>analysis<|message|>The user wants Paris's weather; get_weather gives it.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
ANSWER = (
    "<|channel|>analysis<|message|>The tool says 22 °C and sunny.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Sunny in Paris: 22 °C, café weather.<|return|>"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def answer_after_result(tok: Tokenizer):
    """The script: a call, or the answer once the prompt holds the tool's result."""
    call, answer = tok.encode(CALL, add_special_tokens=False), tok.encode(ANSWER, add_special_tokens=False)
    return lambda prompt: answer if "<|start|>functions.get_weather to=assistant" in tok.decode(prompt, False) else call


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_harmony_model(tmp_path_factory.mktemp("harmony"))


def serve(path: str, body_of_test, **app_flags):
    """Run body_of_test(AsyncOpenAI client, raw httpx client) against an in-process app."""
    engine = AsyncLLMEngine(lambda: LLMEngine(path, dtype="float32"))
    engine.start()

    async def go():
        transport = httpx.ASGITransport(app=build_app(engine, "m", **app_flags))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as raw:
            client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=raw, max_retries=0)
            await body_of_test(client, raw)

    try:
        asyncio.run(go())
    finally:
        engine.shutdown()


def test_a_tool_call_round_trips_through_harmony_with_the_openai_client(model_dir, monkeypatch):
    tok = Tokenizer.from_hf_dir(model_dir)
    prompts = script_sampling(monkeypatch, answer_after_result(tok))

    async def body(client, raw):
        r = await client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], reasoning_effort="high")
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.reasoning_content == "The user wants Paris's weather; get_weather gives it."
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"} and call.id.startswith("call_")
        # The call and its result go back; the template renders them, and the model answers.
        history = [*ASK, choice.message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 22, "sky": "sunny"}'})
        r2 = await client.chat.completions.create(model="m", messages=history, tools=[WEATHER])
        c2 = r2.choices[0]
        assert c2.finish_reason == "stop" and c2.message.tool_calls is None
        assert c2.message.content == "Sunny in Paris: 22 °C, café weather."
        assert c2.message.reasoning_content == "The tool says 22 °C and sunny."

        # Streamed: reasoning deltas, then the call whole, then finish_reason tool_calls.
        chunks = [
            c async for c in await client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True)
        ]
        deltas = [c.choices[0].delta for c in chunks]
        assert deltas[0].role == "assistant"
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == choice.message.reasoning_content
        assert sum(1 for d in deltas if getattr(d, "reasoning_content", None)) > 3  # streamed, not sent at the end
        assert "".join(d.content or "" for d in deltas) == ""
        calls = [tc for d in deltas for tc in d.tool_calls or []]
        assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
            (0, "get_weather", {"city": "Paris"})
        ]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        stream2 = await client.chat.completions.create(model="m", messages=history, tools=[WEATHER], stream=True)
        deltas2 = [c.choices[0].delta async for c in stream2 if c.choices]
        assert "".join(d.content or "" for d in deltas2) == c2.message.content
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas2) == c2.message.reasoning_content

    serve(str(model_dir), body, **SERVER_FLAGS)
    rendered = [tok.decode(p, False) for p in prompts]
    assert "Reasoning: high" in rendered[0] and "type get_weather" in rendered[0]
    assert "Reasoning: medium" in rendered[1]
    # The reply went back as the client returned it: its reasoning_content as the call's analysis.
    analysis = (
        "<|start|>assistant<|channel|>analysis<|message|>The user wants Paris's weather; get_weather gives it.<|end|>"
    )
    call = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    assert analysis + call in rendered[1]


def test_bad_reasoning_effort_and_constrained_tool_choice_are_400_naming_the_field(model_dir, tiny_llama):
    async def harmony_body(client, raw):
        for extra, field in (
            ({"reasoning_effort": "extreme"}, "reasoning_effort"),
            ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
        ):
            with pytest.raises(openai.BadRequestError) as e:
                await client.chat.completions.create(model="m", messages=ASK, **extra)
            assert e.value.body["param"] == field and field in e.value.body["message"], e.value.body

    serve(str(model_dir), harmony_body, **SERVER_FLAGS)

    async def llama_body(client, raw):  # a template that never reads reasoning_effort
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="m", messages=ASK, reasoning_effort="low", max_tokens=2)
        assert e.value.body["param"] == "reasoning_effort" and "does not read" in e.value.body["message"]
        # And an answer without it keeps the plain shape: no reasoning_content to speak of.
        r = await client.chat.completions.create(model="m", messages=ASK, max_tokens=2)
        assert r.choices[0].message.reasoning_content is None

    serve(str(tiny_llama[2]), llama_body)


def test_serve_refuses_harmony_flags_on_a_tokenizer_without_its_tokens(tiny_llama):
    """The flags reach the server: --reasoning-parser openai_gptoss on a model whose tokenizer has
    no harmony markers stops `tacit serve` with the missing tokens named, exit 2."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tacit.cli", "serve", "--model", str(tiny_llama[2]), "--dtype", "float32"]
    r = subprocess.run(
        [*cmd, "--port", str(free_port()), "--reasoning-parser", "openai_gptoss"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert "tacit: error: the harmony format needs the special tokens" in r.stderr and "lacks <|start|>" in r.stderr
