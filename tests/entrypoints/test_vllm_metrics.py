"""/metrics under vLLM 0.11.0's names (issue 35): every `vllm:*` series that vLLM's Grafana
dashboard (deploy/grafana/vllm-0.11.0-grafana.json, committed unmodified) queries is served, with
vLLM's labels and buckets and values that count what was served. In process: the app over a real
engine on a tiny llama, through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tacit import LLM, SamplingParams  # noqa: E402
from tacit.engine.async_engine import AsyncLLMEngine  # noqa: E402
from tacit.engine.vllm_metrics import FinishedSequence, VllmRequestMetrics  # noqa: E402
from tacit.entrypoints.openai.api_server import build_app  # noqa: E402

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "vllm-0.11.0-grafana.json"
PROMPT = [5, 6, 7, 8, 9]
MAX_TOKENS = 4
# vLLM 0.11.0's vllm/v1/metrics/loggers.py, copied here rather than imported from tacit so that a
# drift in tacit's constants fails this test.
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0]
VLLM_TTFT += [80.0, 160.0, 640.0, 2560.0]
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
VLLM_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0]
VLLM_LATENCY += [480.0, 960.0, 1920.0, 7680.0]
PER_REQUEST = {  # histogram -> its buckets (None: vLLM's 1-2-5 token buckets up to max_model_len)
    "vllm:time_to_first_token_seconds": VLLM_TTFT,
    "vllm:e2e_request_latency_seconds": VLLM_LATENCY,
    "vllm:request_queue_time_seconds": VLLM_LATENCY,
    "vllm:request_prefill_time_seconds": VLLM_LATENCY,
    "vllm:request_decode_time_seconds": VLLM_LATENCY,
    "vllm:request_inference_time_seconds": VLLM_LATENCY,
    "vllm:request_time_per_output_token_seconds": VLLM_ITL,
    "vllm:request_prompt_tokens": None,
    "vllm:request_generation_tokens": None,
    "vllm:request_max_num_generation_tokens": None,
    "vllm:request_params_max_tokens": None,
    "vllm:request_params_n": [1, 2, 5, 10, 20],
}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$")


@pytest.fixture(scope="module")
def engine(tiny_llama):
    e = AsyncLLMEngine.from_engine_args(model=str(tiny_llama[2]), dtype="float32")
    e.start()
    yield e
    e.shutdown()


def _serve_and_scrape(engine) -> str:
    app = build_app(engine, "tiny/m")
    body = {"model": "tiny/m", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}

    async def run() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for _ in range(2):
                r = await client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS
            # The snapshot gauges are published after the step that answered: scrape once it is out.
            for _ in range(100):
                text = (await client.get("/metrics")).text
                if 'vllm:num_requests_running{model_name="tiny/m",engine="0"} 0\n' in text:
                    return text
                await asyncio.sleep(0.05)
            raise AssertionError(f"the engine never reported itself idle:\n{text}")

    return asyncio.run(run())


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"not a labelled Prometheus sample: {line!r}"
            labels = dict(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(2)))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def _dashboard_names() -> set[str]:
    """The vllm:* series the dashboard's panel expressions query."""
    exprs: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            exprs.extend(v for k, v in node.items() if k == "expr" and isinstance(v, str))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text()))
    return {name for e in exprs for name in re.findall(r"vllm:[a-z0-9_]+", e)}


def _one_two_five(max_value: int) -> list[float]:
    return [float(m * 10**e) for e in range(12) for m in (1, 2, 5) if m * 10**e <= max_value]


def _value(samples, name: str, **labels: str) -> float:
    (v,) = [v for n, ls, v in samples if n == name and labels.items() <= ls.items()]
    return v


def test_every_series_the_vllm_dashboard_queries_is_served_with_vllms_labels(engine):
    text = _serve_and_scrape(engine)
    samples = _samples(text)
    names = _dashboard_names()
    # The dashboard queries 21 series: latencies, token counts, queue/prefill/decode, cache, requests.
    assert len(names) == 21 and "vllm:e2e_request_latency_seconds_bucket" in names, names
    for name in sorted(names):
        found = [ls for n, ls, _ in samples if n == name]
        assert found, f"{name} (queried by the dashboard) is not in /metrics"
        assert all(ls.get("model_name") == "tiny/m" and ls.get("engine") == "0" for ls in found), (name, found)
    # Counters carry _total in their TYPE line too, as prometheus_client writes them.
    for counter in ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert f"# TYPE {counter} counter" in text

    # Both requests ran out of max_tokens; vLLM's other finish reasons are there at 0.
    success = {ls["finished_reason"]: v for n, ls, v in samples if n == "vllm:request_success_total"}
    assert success == {"stop": 0, "length": 2, "abort": 0}
    assert _value(samples, "vllm:prompt_tokens_total") == 2 * len(PROMPT)
    assert _value(samples, "vllm:generation_tokens_total") == 2 * MAX_TOKENS
    assert _value(samples, "vllm:num_requests_running") == 0 and _value(samples, "vllm:num_requests_waiting") == 0
    usage = _value(samples, "vllm:kv_cache_usage_perc")
    assert 0 <= usage <= 1 and _value(samples, "vllm:gpu_cache_usage_perc") == usage

    # Every per-request histogram counted each request once, in vLLM's buckets.
    token_buckets = _one_two_five(engine.max_model_len)
    for name, buckets in PER_REQUEST.items():
        les = [ls["le"] for n, ls, _ in samples if n == f"{name}_bucket"]
        assert les == [repr(float(b)) for b in (buckets or token_buckets)] + ["+Inf"], name
        assert _value(samples, f"{name}_count") == 2, name
    assert _value(samples, "vllm:request_prompt_tokens_sum") == 2 * len(PROMPT)
    assert _value(samples, "vllm:request_generation_tokens_sum") == 2 * MAX_TOKENS
    assert _value(samples, "vllm:request_max_num_generation_tokens_sum") == 2 * MAX_TOKENS
    assert _value(samples, "vllm:request_params_max_tokens_sum") == 2 * MAX_TOKENS
    assert _value(samples, "vllm:request_params_n_sum") == 2
    # One gap per step after the first token, per request, as vLLM observes it.
    itl_les = [ls["le"] for n, ls, _ in samples if n == "vllm:inter_token_latency_seconds_bucket"]
    assert itl_les == [repr(b) for b in VLLM_ITL] + ["+Inf"]
    assert _value(samples, "vllm:inter_token_latency_seconds_count") == 2 * (MAX_TOKENS - 1)
    assert _value(samples, "vllm:time_per_output_token_seconds_count") == 2 * (MAX_TOKENS - 1)
    # The intervals add up: inference = prefill + decode, and all of it lies inside e2e.
    prefill, decode, queue, inference = (
        _value(samples, f"vllm:request_{k}_time_seconds_sum") for k in ("prefill", "decode", "queue", "inference")
    )
    e2e = _value(samples, "vllm:e2e_request_latency_seconds_sum")
    assert min(prefill, decode, queue) >= 0 and decode > 0
    assert inference == pytest.approx(prefill + decode, abs=1e-9)
    assert queue + inference <= e2e
    assert _value(samples, "vllm:inter_token_latency_seconds_sum") == pytest.approx(decode, abs=1e-9)
    # One observation per engine step: the prompt counted in its first token's step.
    assert _value(samples, "vllm:iteration_tokens_total_sum") == 2 * (len(PROMPT) + MAX_TOKENS)
    assert _value(samples, "vllm:iteration_tokens_total_count") >= 2 * MAX_TOKENS  # a step per token at least
    # tacit's own names stay.
    assert _value(samples, "tacit_time_to_first_token_seconds_count") == 2
    assert _value(samples, "tacit_requests_total", finish_reason="length") == 2


def test_intervals_are_vllms_definitions():
    """queue = scheduled - queued, prefill = first token - scheduled, decode = last - first token,
    inference = last token - scheduled, e2e = finish - arrival; TPOT leaves the first token out."""
    m = VllmRequestMetrics(max_model_len=100)
    assert m.prompt_tokens.buckets == (1, 2, 5, 10, 20, 50, 100)
    m.observe_sequence(FinishedSequence("stop", 10.0, 10.5, 12.0, 13.0, 16.0, 16.0, 7, 4, None))
    m.observe_sequence(FinishedSequence("length", 10.0, 10.5, 11.0, None, None, 11.5, 7, 0, 0))  # max_tokens=0
    m.observe_request(n=2, max_num_generation_tokens=4)
    got = {name: h.snapshot() for name, h in vars(m).items() if hasattr(h, "snapshot")}
    assert got["queue"][1] == 1.5 + 0.5 and sum(got["queue"][0]) == 2
    assert got["prefill"] == ([0, 0, 0, 1] + [0] * 18, 1.0)  # 1.0 s falls in le="1.0"
    assert got["decode"][1] == 3.0 and got["inference"][1] == 4.0 and got["e2e"][1] == 6.0 + 1.5
    assert got["time_per_output_token"][1] == 1.0  # 3 s over the 3 tokens after the first
    assert sum(got["max_tokens_param"][0]) == 0  # unset and 0 are not observed, as in vLLM
    assert got["params_n"][1] == 2 and got["max_num_generation_tokens"][1] == 4
    assert m.success == {"stop": 1, "length": 1, "abort": 0}
    with pytest.raises(ValueError, match="max_model_len"):
        VllmRequestMetrics(max_model_len=0)


def test_first_scheduled_time_lies_between_arrival_and_first_token(tiny_llama):
    llm = LLM(str(tiny_llama[2]), dtype="float32")
    (out,) = llm.generate(["Hello there"], SamplingParams(max_tokens=2, n=2))
    m = out.metrics
    assert m["arrival_time"] <= m["first_scheduled_time"] <= m["first_token_time"]
