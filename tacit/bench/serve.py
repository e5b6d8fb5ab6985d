"""`tacit bench serve --url URL`: load any OpenAI-compatible server the way `vllm bench serve` does.

Requests stream from /v1/completions. Arrivals are Poisson at --request-rate, or gamma with
--burstiness (shape; 1 is Poisson, below 1 burstier), or all at once when the rate is inf;
--max-concurrency caps requests in flight. Per request: TTFT (send to first token), TPOT
((e2e - TTFT) / (tokens - 1)), ITL (every gap between chunks) and end-to-end latency.
Goodput counts requests per second that met every --slo bound. --structured-fraction F sends a
seeded F of the requests with a json_schema response_format (the same prompts and lengths for
every F), so one invocation can compare constrained decoding's cost against plain decoding.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import numpy as np

from tacit.bench.workloads import sample_lengths

_WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case "
    "point government company number group problem fact"
).split()


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


SLO_KEYS = ("ttft", "tpot", "e2e")


def parse_slo(spec: str | None) -> dict[str, float]:
    """'ttft:500,tpot:50' or 'ttft=500,tpot=50' -> {'ttft': 0.5, 'tpot': 0.05} (milliseconds in,
    seconds out). Both separators: bench serve's --slo has always written ':', `tacit tune --slo`
    and --slo-class write '='."""
    if not spec:
        return {}
    out = {}
    for part in spec.split(","):
        key, _, ms = part.replace("=", ":", 1).partition(":")
        key = key.strip()
        try:
            value = float(ms)
        except ValueError:
            value = float("nan")
        if key not in SLO_KEYS or not value > 0 or value == float("inf"):
            raise ValueError(
                f"--slo part {part!r} is invalid; write e.g. ttft:500,tpot:50 or ttft=500,tpot=50 "
                f"(milliseconds > 0; keys {', '.join(SLO_KEYS)})"
            )
        out[key] = value / 1000
    return out


def meets(r: RequestResult, slo: dict[str, float]) -> bool:
    """Did a finished request meet every bound in slo (seconds; keys ttft, tpot, e2e)?"""
    return all((getattr(r, k) if k != "tpot" else (r.tpot or 0.0)) <= v for k, v in slo.items())


def structured_body(output_len: int) -> dict:
    """The json_schema response_format a constrained benchmark request carries: the shape
    `client.chat.completions.parse` sends (strict object, typed fields), ending in a string whose
    minLength (16 characters a token, more than any of SmolLM2's common tokens) keeps the grammar
    open past output_len tokens, so a constrained request stops at max_tokens like a plain one
    with ignore_eos and both kinds produce the same number of tokens."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 32},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 4},
            "summary": {"type": "string", "minLength": 16 * output_len},
        },
        "required": ["name", "age", "tags", "summary"],
        "additionalProperties": False,
    }
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema, "strict": True}}
    }


def structured_mask(num_prompts: int, fraction: float, seed: int) -> list[bool]:
    """Which requests carry a grammar: round(fraction * n) of them, spread by a seeded shuffle."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"--structured-fraction {fraction} is invalid: each value must be in [0, 1]")
    chosen = np.random.default_rng(seed + 2).permutation(num_prompts)[: round(fraction * num_prompts)]
    mask = [False] * num_prompts
    for i in chosen:
        mask[int(i)] = True
    return mask


def _prompt(n_words: int, rng: np.random.Generator) -> str:
    return " ".join(rng.choice(_WORDS, n_words))


async def _one(
    client, url: str, model: str, prompt: str, max_tokens: int, headers: dict, extra: dict | None = None
) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    t0 = time.perf_counter()
    last = None
    res = RequestResult(ok=False)
    chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("usage") and not data.get("choices"):
                    res.output_tokens = data["usage"].get("completion_tokens", chunks)
                    continue
                if not data.get("choices") or not data["choices"][0].get("text"):
                    continue
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last)
                last = now
                chunks += 1
    except Exception as e:  # a load test reports failures, it does not stop at the first
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.e2e = time.perf_counter() - t0
    res.output_tokens = res.output_tokens or chunks
    res.ok = last is not None
    return res


async def _run(
    url: str,
    model: str,
    requests: list[tuple[str, int, dict]],
    rate: float,
    burstiness: float,
    max_concurrency: int | None,
    api_key: str | None,
    seed: int,
) -> tuple[list[RequestResult], float]:
    import httpx

    rng = np.random.default_rng(seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None)) as client:

        async def guarded(p: str, n: int, extra: dict) -> RequestResult:
            if limit is None:
                return await _one(client, url, model, p, n, headers, extra)
            async with limit:
                return await _one(client, url, model, p, n, headers, extra)

        tasks = []
        t0 = time.perf_counter()
        for p, n, extra in requests:
            tasks.append(asyncio.create_task(guarded(p, n, extra)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.gamma(burstiness, 1.0 / (rate * burstiness)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - t0


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    a = np.asarray(values) * 1000
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
    }


def run(
    url: str,
    model: str,
    num_prompts: int,
    dist: str,
    input_len: int,
    output_len: int,
    rate: float = float("inf"),
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    slo: dict[str, float] | None = None,
    api_key: str | None = None,
    seed: int = 0,
    structured_fraction: float = 0.0,
) -> dict:
    rng = np.random.default_rng(seed)
    pairs = sample_lengths(dist, num_prompts, input_len, output_len, seed=seed)
    mask = structured_mask(num_prompts, structured_fraction, seed)
    requests = [(_prompt(i, rng), o, structured_body(o) if m else {}) for (i, o), m in zip(pairs, mask)]
    results, duration = asyncio.run(
        _run(url.rstrip("/"), model, requests, rate, burstiness, max_concurrency, api_key, seed)
    )
    ok = [r for r in results if r.ok]
    slo = slo or {}
    good = [r for r in ok if meets(r, slo)]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "structured_fraction": structured_fraction,
        "num_structured": sum(mask),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "request_throughput": len(ok) / duration,
        "output_tok_s": out_tokens / duration,
        "goodput_req_s": len(good) / duration if slo else None,
        "ttft_ms": _stats([r.ttft for r in ok]),
        "tpot_ms": _stats([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": _stats([x for r in ok for x in r.itl]),
        "e2e_ms": _stats([r.e2e for r in ok]),
        "_e2e_values": [r.e2e for r in ok],
    }
