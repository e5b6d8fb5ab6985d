"""The checkpoint's generation_config.json sampling values are what a request that leaves them unset
samples with, as in vLLM (--generation-config auto; `vllm` ignores them), a request that sets them
wins, and the server says so at start-up."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tacit import LLM, SamplingParams  # noqa: E402
from tacit.bench.launch import free_port, stop_process, wait_healthy  # noqa: E402
from tacit.engine.async_engine import AsyncLLMEngine  # noqa: E402
from tacit.engine.llm_engine import LLMEngine  # noqa: E402
from tacit.entrypoints.openai.api_server import build_app, describe_sampling_defaults  # noqa: E402
from tacit.loader import sampling_defaults  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL_DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def gen_model(tiny_llama, tmp_path_factory) -> Path:
    """The tiny llama with a generation_config.json that sets sampling values, as Qwen3's does."""
    path = tmp_path_factory.mktemp("gen_config") / "model"
    shutil.copytree(tiny_llama[2], path)
    gen = path / "generation_config.json"
    doc = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**doc, **MODEL_DEFAULTS}))
    return path


def _served_params(
    model: Path, requests: list[tuple[str, dict]], status: int = 200, **engine_kwargs
) -> tuple[list[SamplingParams], list[dict]]:
    """The SamplingParams the engine receives for the requests, posted in order to the server's
    app, and their response bodies (each answered with `status`)."""
    engine = AsyncLLMEngine(lambda: LLMEngine(str(model), dtype="float32", **engine_kwargs))
    engine.start()
    seen: list[SamplingParams] = []
    bodies: list[dict] = []
    add = engine.add_request

    async def spy(ids, params, *args, **kwargs):
        seen.append(params)
        return await add(ids, params, *args, **kwargs)

    engine.add_request = spy

    async def post_all() -> None:
        transport = httpx.ASGITransport(app=build_app(engine, "m"))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for route, body in requests:
                r = await client.post(route, json={"model": "m", **body})
                assert r.status_code == status, r.text
                bodies.append(r.json())

    try:
        asyncio.run(post_all())
    finally:
        engine.shutdown()
    assert len(seen) == (len(requests) if status == 200 else 0)
    return seen, bodies


def _sampling(p: SamplingParams) -> tuple:
    return p.temperature, p.top_p, p.top_k, p.repetition_penalty


def test_a_request_that_omits_sampling_gets_the_models_and_one_that_sets_it_wins(gen_model):
    (chat, completion, responses, set_to_openai_defaults, set_temperature_only), _ = _served_params(
        gen_model,
        [
            ("/v1/chat/completions", CHAT),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
            ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
            # The values OpenAI's defaults would give, sent explicitly: set, so they win.
            (
                "/v1/chat/completions",
                {**CHAT, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0},
            ),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "temperature": 0.0}),
        ],
    )
    for p in (chat, completion, responses):
        assert _sampling(p) == (0.6, 0.9, 20, 1.05)
    assert _sampling(set_to_openai_defaults) == (1.0, 1.0, -1, 1.0)
    assert _sampling(set_temperature_only) == (0.0, 0.9, 20, 1.05)


def test_repetition_penalty_is_taken_and_a_bad_one_refused_naming_it(gen_model):
    completion = {"prompt": "hi", "max_tokens": 2}
    seen, _ = _served_params(
        gen_model,
        [
            ("/v1/completions", {**completion, "repetition_penalty": 1.3}),
            ("/v1/chat/completions", {**CHAT, "repetition_penalty": 0.8}),
        ],
    )
    assert [p.repetition_penalty for p in seen] == [1.3, 0.8]
    for value in (0, -1, 0.0):
        _, bodies = _served_params(
            gen_model,
            [
                ("/v1/completions", {**completion, "repetition_penalty": value}),
                ("/v1/chat/completions", {**CHAT, "repetition_penalty": value}),
            ],
            status=400,
        )
        for body in bodies:
            assert body["error"]["param"] == "repetition_penalty", body
            assert "must be a finite number > 0" in body["error"]["message"], body


def test_generation_config_vllm_ignores_the_models_values(gen_model):
    (p,), _ = _served_params(gen_model, [("/v1/chat/completions", CHAT)], generation_config="vllm")
    assert _sampling(p) == _sampling(SamplingParams()) == (1.0, 1.0, -1, 1.0)


def test_generation_config_folder_and_bad_values(gen_model, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3}))
    assert sampling_defaults(gen_model, str(tmp_path)) == {"temperature": 0.3}
    assert sampling_defaults(gen_model) == MODEL_DEFAULTS
    with pytest.raises(FileNotFoundError, match="valid: auto .*vllm"):
        sampling_defaults(gen_model, str(tmp_path / "nowhere"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.0}))
    with pytest.raises(ValueError, match="generation_config.json: SamplingParams.top_p=0.0 is invalid"):
        sampling_defaults(gen_model, str(tmp_path))
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 0}))
    with pytest.raises(ValueError, match="generation_config.json: SamplingParams.repetition_penalty=0 is invalid"):
        sampling_defaults(gen_model, str(tmp_path))


def test_llm_generate_without_params_samples_with_the_models_defaults(gen_model):
    llm = LLM(str(gen_model), dtype="float32")
    seen: list[SamplingParams] = []
    add = llm.engine.add_request
    llm.engine.add_request = lambda prompt, params, **kw: (seen.append(params), add(prompt, params, **kw))[1]
    llm.generate("hi")
    llm.generate("hi", SamplingParams(temperature=1.0, max_tokens=2))
    assert _sampling(seen[0]) == (0.6, 0.9, 20, 1.05)
    assert _sampling(seen[1]) == (1.0, 1.0, -1, 1.0)


def test_the_start_up_line_states_the_served_defaults(gen_model):
    assert describe_sampling_defaults({}) == "sampling defaults: OpenAI's (temperature 1, top_p 1)"
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tacit.cli", "serve", "--model", str(gen_model), "--dtype", "float32"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log: list[str] = []

    def drain() -> None:  # keep the pipe from filling up
        for line in proc.stdout:
            log.append(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, 120, lambda: "".join(log))
    finally:
        stop_process(proc)
    loaded = next(line for line in "".join(log).splitlines() if line.startswith("tacit: loaded"))
    want = (
        "sampling defaults from generation_config.json: temperature 0.6, top_p 0.9, top_k 20, repetition_penalty 1.05"
    )
    assert want in loaded and "not applied" not in loaded


def test_serving_beyond_loopback_without_a_key_is_warned_of():
    from tacit.entrypoints.openai.api_server import open_bind_warning

    assert open_bind_warning("127.0.0.1", None) is None and open_bind_warning("::1", None) is None
    assert open_bind_warning("0.0.0.0", "secret") is None
    warning = open_bind_warning("0.0.0.0", None)
    assert "serving on 0.0.0.0 without --api-key" in warning and "bind 127.0.0.1" in warning


def test_the_runner_says_what_runs_a_decode_step(tiny_llama):
    from tacit import LLM

    runner = LLM(str(tiny_llama[2]), dtype="float32").engine.runner
    assert runner.decode_path == "torch path (dtype float32: the fused step runs bfloat16)"
