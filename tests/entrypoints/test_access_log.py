"""`tacit serve --enable-log-requests` and `--enable-tokenizer-info-endpoint`, in process (the
app over a real engine on a tiny llama, through httpx's ASGI transport): one access line per
request with the counts the response reports, errors with their status, nothing when off; and
vLLM's GET /tokenizer_info, 404 unless enabled."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tacit.engine.async_engine import AsyncLLMEngine  # noqa: E402
from tacit.entrypoints.openai import access_log  # noqa: E402
from tacit.entrypoints.openai.api_server import build_app  # noqa: E402

from tiny_models import CHAT_TEMPLATE  # noqa: E402

PROMPT = [5, 6, 7, 8, 9]
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
FIELDS = {
    "request_id",
    "response_id",
    "method",
    "route",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "total_ms",
}


@pytest.fixture(scope="module")
def engine(tiny_llama):
    e = AsyncLLMEngine.from_engine_args(model=str(tiny_llama[2]), dtype="float32")
    e.start()
    yield e
    e.shutdown()


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lines():
    """The records on tacit.access, whatever the root logger's configuration."""
    handler = Collect()
    logger = access_log.logger
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)


def _calls(app, *calls: tuple) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.request(method, url, **kw) for method, url, kw in calls]

    return asyncio.run(run())


def test_a_completion_is_one_line_with_its_counts_and_times(engine, lines):
    app = build_app(engine, "m", enable_log_requests=True)
    (r,) = _calls(app, ("POST", "/v1/completions", {"json": BODY, "headers": {"X-Request-Id": "abc 1"}}))
    assert r.status_code == 200, r.text
    assert len(lines) == 1
    fields = lines[0].access
    assert set(fields) == FIELDS
    usage = r.json()["usage"]
    assert fields["request_id"] == "abc 1" and fields["response_id"] == r.json()["id"]
    assert (fields["method"], fields["route"], fields["status"]) == ("POST", "/v1/completions", 200)
    assert fields["prompt_tokens"] == usage["prompt_tokens"] == len(PROMPT)
    assert fields["completion_tokens"] == usage["completion_tokens"] == 4
    assert 0 <= fields["ttft_ms"] <= fields["total_ms"]
    assert lines[0].levelno == logging.INFO
    text = lines[0].getMessage()
    assert text.startswith('POST /v1/completions 200 request_id="abc 1" response_id=cmpl-')  # quoted: a space
    assert "prompt_tokens=5 completion_tokens=4 ttft_ms=" in text


def test_a_streamed_chat_counts_what_it_streamed(engine, lines):
    app = build_app(engine, "m", enable_log_requests=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    body |= {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    (r,) = _calls(app, ("POST", "/v1/chat/completions", {"json": body}))
    assert r.status_code == 200
    usage = json.loads([e for e in r.text.splitlines() if '"usage":{' in e][-1][6:])["usage"]
    assert len(lines) == 1
    fields = lines[0].access
    assert fields["route"] == "/v1/chat/completions" and fields["status"] == 200
    assert fields["request_id"] == r.headers["x-request-id"]
    assert (fields["prompt_tokens"], fields["completion_tokens"]) == (usage["prompt_tokens"], 3)
    assert fields["ttft_ms"] is not None


def test_errors_are_logged_with_their_status(engine, lines):
    app = build_app(engine, "m", api_key="k", enable_log_requests=True)
    auth = {"Authorization": "Bearer k"}
    bad, unauthorized, missing = _calls(
        app,
        ("POST", "/v1/completions", {"json": {**BODY, "max_tokens": -1}, "headers": auth}),
        ("POST", "/v1/completions", {"json": BODY}),
        ("GET", "/v1/nothing%0Aforged", {"headers": auth}),
    )
    assert (bad.status_code, unauthorized.status_code, missing.status_code) == (400, 401, 404)
    assert [r.access["status"] for r in lines] == [400, 401, 404]
    assert lines[0].access["prompt_tokens"] is None and lines[0].access["ttft_ms"] is None
    assert lines[0].getMessage().startswith("POST /v1/completions 400 ") and "prompt_tokens=- " in lines[0].getMessage()
    # The path as sent: a %0A in it does not start a second line.
    assert lines[2].access["route"] == "/v1/nothing%0Aforged" and "\n" not in lines[2].getMessage()


def test_polled_routes_are_logged_only_when_they_fail(engine, lines):
    app = build_app(engine, "m", enable_log_requests=True)
    health, metrics, models = _calls(app, ("GET", "/health", {}), ("GET", "/metrics", {}), ("GET", "/v1/models", {}))
    assert health.status_code == metrics.status_code == models.status_code == 200
    assert [r.access["route"] for r in lines] == ["/v1/models"]


def test_nothing_is_logged_without_the_flag(engine, lines):
    (r,) = _calls(build_app(engine, "m"), ("POST", "/v1/completions", {"json": BODY}))
    assert r.status_code == 200 and lines == []


def test_json_format_writes_one_object_a_line(engine):
    out = io.StringIO()
    handler = access_log.configure_access_log("json", out)
    try:
        app = build_app(engine, "m", enable_log_requests=True)
        _calls(app, ("POST", "/v1/completions", {"json": BODY}), ("POST", "/v1/completions", {"json": {"x": 1}}))
    finally:
        access_log.logger.removeHandler(handler)
        access_log.logger.propagate = True
    objects = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [o["status"] for o in objects] == [200, 400]
    assert set(objects[0]) == FIELDS | {"timestamp"} and objects[0]["completion_tokens"] == 4
    assert objects[0]["timestamp"].endswith("+00:00")


def test_an_unknown_log_format_is_refused():
    with pytest.raises(ValueError, match="'xml'.*text, json"):
        access_log.configure_access_log("xml")


def test_tokenizer_info_is_vllms_shape_when_enabled(engine):
    app = build_app(engine, "m", api_key="k", enable_tokenizer_info_endpoint=True)
    info, unauthorized = _calls(
        app, ("GET", "/tokenizer_info", {"headers": {"Authorization": "Bearer k"}}), ("GET", "/tokenizer_info", {})
    )
    assert info.status_code == 200 and unauthorized.status_code == 401  # behind the key, as /tokenize
    got = info.json()
    assert got["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert got["eos_token"] == "<|im_end|>" and got["bos_token"] is None and got["pad_token"] is None
    assert got["chat_template"] == CHAT_TEMPLATE
    assert got["max_model_len"] == engine.max_model_len


def test_tokenizer_info_is_404_without_the_flag(engine):
    (r,) = _calls(build_app(engine, "m"), ("GET", "/tokenizer_info", {}))
    assert r.status_code == 404


def test_tokenizer_info_serves_the_config_as_vllm_does(tiny_llama):
    """A checkpoint's tokenizer_config.json: file paths dropped, AddedToken entries as their text,
    the class as the fast variant transformers loads from tokenizer.json, the rest as written."""
    from types import SimpleNamespace

    from tacit.entrypoints.openai.serving_tokenization import TokenizationServing
    from tacit.tokenizer import Tokenizer

    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": {"__type": "AddedToken", "content": "<|im_start|>", "special": True},
        "added_tokens_decoder": {"1": {"content": "<|im_start|>", "special": True}},
        "vocab_file": "/somewhere/vocab.json",
        "merges_file": "/somewhere/merges.txt",
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    tok = Tokenizer(tiny_llama[1], None, "<|im_start|>", "<|im_end|>", config=config)
    info = TokenizationServing(SimpleNamespace(tokenizer=tok, max_model_len=512)).tokenizer_info()
    assert info == {
        "tokenizer_class": "LlamaTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": None,
        "added_tokens_decoder": {"1": "<|im_start|>"},
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "max_model_len": 512,
    }
    assert "chat_template" not in info  # none in use
