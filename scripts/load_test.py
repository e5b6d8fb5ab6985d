"""Drive a running `tacit serve` with N concurrent streaming chat clients for a bounded time.

    tacit serve &                       # the embedded default model on 127.0.0.1:8000
    python scripts/load_test.py --clients 64 --duration 60 --max-tokens 64

Each client loops: send a streamed chat request, read it to `data: [DONE]`, repeat, until the
duration is up (requests in flight then finish, bounded by --grace). Output tokens are counted
from the server's usage chunk (stream_options.include_usage), so they are tokens, not SSE events.
Prints one JSON object: requests completed, errors, output tok/s, TTFT and latency percentiles,
and the engine's own counters from /metrics (steps, preemptions) over the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "List three uses of a paperclip.",
    "What is the capital of France, and why is it famous?",
    "Give me a tip for learning Python.",
    "Describe a sunrise to someone who has never seen one.",
    "Why do cats purr?",
    "Summarize the plot of a heist movie you invent.",
]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def scrape(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#") and "{" in line:
            name_labels, value = line.rsplit(" ", 1)
            if "le=" not in name_labels and "finish_reason" not in name_labels:
                out[name_labels.split("{")[0]] = float(value)
    return out


async def client_loop(i: int, http: httpx.AsyncClient, args: argparse.Namespace, stop_at: float,
                      results: dict) -> None:
    n = 0
    while time.monotonic() < stop_at:
        prompt = PROMPTS[(i + n) % len(PROMPTS)]
        n += 1
        body = {"model": args.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        if args.model is None:
            del body["model"]
        t0 = time.monotonic()
        ttft = None
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    results["errors"].append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                    await asyncio.sleep(0.5)
                    continue
                tokens, done = 0, False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise RuntimeError(event["error"]["message"])
                    if ttft is None and any(c["delta"].get("content") for c in event.get("choices", [])):
                        ttft = time.monotonic() - t0
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                if not done:
                    raise RuntimeError("stream ended without [DONE]")
        except Exception as e:  # noqa: BLE001 - a load test counts failures, it does not stop on them
            results["errors"].append(repr(e)[:200])
            continue
        results["latency"].append(time.monotonic() - t0)
        if ttft is not None:
            results["ttft"].append(ttft)
        results["tokens"] += tokens
        results["completed"] += 1


async def run(args: argparse.Namespace) -> dict:
    results = {"completed": 0, "errors": [], "tokens": 0, "ttft": [], "latency": []}
    before = scrape(args.url)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=args.url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(args.duration + args.grace)) as http:
        tasks = [asyncio.create_task(client_loop(i, http, args, t0 + args.duration, results))
                 for i in range(args.clients)]
        done, pending = await asyncio.wait(tasks, timeout=args.duration + args.grace)
        for t in pending:  # past the grace period: cut them off (they count as neither)
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    elapsed = time.monotonic() - t0
    after = scrape(args.url)
    r3 = lambda x: None if x is None else round(x, 3)  # noqa: E731
    return {
        "clients": args.clients, "duration_s": args.duration, "elapsed_s": round(elapsed, 1),
        "max_tokens": args.max_tokens, "requests_completed": results["completed"],
        "requests_cut_off": len(pending), "errors": len(results["errors"]),
        "error_samples": results["errors"][:3], "output_tokens": results["tokens"],
        "output_tok_per_s": round(results["tokens"] / elapsed, 1),
        "requests_per_s": round(results["completed"] / elapsed, 2),
        "ttft_p50_s": r3(percentile(results["ttft"], 0.5)), "ttft_p99_s": r3(percentile(results["ttft"], 0.99)),
        "latency_p50_s": r3(percentile(results["latency"], 0.5)),
        "latency_mean_s": r3(statistics.fmean(results["latency"]) if results["latency"] else None),
        "engine_steps": after.get("tacit_engine_steps_total", 0) - before.get("tacit_engine_steps_total", 0),
        "engine_generation_tokens": (after.get("tacit_generation_tokens_total", 0)
                                     - before.get("tacit_generation_tokens_total", 0)),
        "preemptions": after.get("tacit_num_preemptions_total", 0) - before.get("tacit_num_preemptions_total", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name to send (default: omit, the server's own)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=60.0, help="seconds during which clients start requests")
    p.add_argument("--grace", type=float, default=60.0, help="seconds in-flight requests get after --duration")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    print(json.dumps(asyncio.run(run(p.parse_args())), indent=2))


if __name__ == "__main__":
    main()
