"""`tacit bench serve --scenario multi-turn | shared-prefix`: the traffic the prefix cache is for,
run against a tacit server with the cache on and one with it off, alternating, in one invocation.

multi-turn: --groups conversations of --group-size turns. Every conversation starts with the same
--prefix-tokens system prompt (tool definitions as JSON, as an agent sends them); each turn adds
a ~--suffix-tokens user message to the earlier turns and their answers (--output-len tokens,
ignore_eos) and is rendered by the server's chat template (/v1/chat/completions); conversations
run concurrently, each turn sent when the previous answer has arrived.
shared-prefix: --groups groups of --group-size requests (SGLang's generated-shared-prefix shape):
a group's requests share a --prefix-tokens prefix and differ in a --suffix-tokens question; all
are sent at once.

Reported per run: mean TTFT of first turns (or of each group's first request) and of the rest,
output tok/s over the run, and the prompt tokens the cache supplied (usage.cached_tokens). Each
run starts a fresh server, so every run starts with an empty cache.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np

from tacit.bench.launch import TacitServer
from tacit.bench.serve import _WORDS

PREFIX_SCENARIOS = ("multi-turn", "shared-prefix")


@dataclass
class Turn:
    group: int
    index: int  # the turn within its conversation, or the request within its group
    ttft: float
    output_tokens: int
    cached_tokens: int
    prompt_tokens: int


def _words(n: int, rng: np.random.Generator) -> str:
    return " ".join(rng.choice(_WORDS, n))


def tool_definitions(num_tokens: int, count) -> str:
    """A system prompt of JSON tool definitions at least num_tokens long by `count` (the
    server's tokenizer): tools are added until it is."""
    tools: list[dict] = []
    text = ""
    while count(text) < num_tokens:
        k = len(tools)
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{k}_{_WORDS[k % len(_WORDS)]}",
                    "description": f"Look up the {_WORDS[(3 * k) % len(_WORDS)]} of a {_WORDS[(7 * k) % len(_WORDS)]}.",
                    "parameters": {
                        "type": "object",
                        "properties": {"id": {"type": "integer"}, "query": {"type": "string"}},
                        "required": ["id"],
                    },
                },
            }
        )
        text = "You can call these tools:\n" + "\n".join(json.dumps(t) for t in tools)
    return text


async def _chat(
    client, url: str, model: str, messages: list[dict], max_tokens: int, extra: dict | None = None
) -> tuple[Turn, str]:
    body = {
        **(extra or {}),
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, text, usage = None, [], {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            for choice in data.get("choices") or ():
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text.append(piece)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    ttft = ttft if ttft is not None else float("nan")
    # A server that sends no usage when streaming (llama.cpp's): one content delta a token.
    out_tokens = usage.get("completion_tokens", len(text))
    turn = Turn(0, 0, ttft, out_tokens, cached, usage.get("prompt_tokens", 0))
    return turn, "".join(text)


async def _multi_turn(
    url: str,
    model: str,
    system: str,
    groups: int,
    turns: int,
    suffix: int,
    out: int,
    seed: int,
    max_concurrency: int | None = None,
    extra: dict | None = None,
):
    """max_concurrency: conversations at once (None: all); extra: fields every request adds."""
    import httpx

    limit = asyncio.Semaphore(max_concurrency or groups)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1200.0, connect=10.0)) as client:

        async def conversation(g: int) -> list[Turn]:
            rng = np.random.default_rng(seed * 1000 + g)
            messages = [{"role": "system", "content": system}]
            done = []
            async with limit:
                for t in range(turns):
                    messages.append({"role": "user", "content": _words(suffix, rng)})
                    turn, answer = await _chat(client, url, model, messages, out, extra)
                    turn.group, turn.index = g, t
                    done.append(turn)
                    messages.append({"role": "assistant", "content": answer})
            return done

        t0 = time.perf_counter()
        results = await asyncio.gather(*(conversation(g) for g in range(groups)))
        return [t for c in results for t in c], time.perf_counter() - t0


async def _shared_prefix(url: str, model: str, prefixes: list[str], size: int, suffix: int, out: int, seed: int):
    import httpx

    rng = np.random.default_rng(seed)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1200.0, connect=10.0)) as client:

        async def one(g: int, i: int, question: str) -> Turn:
            messages = [{"role": "system", "content": prefixes[g]}, {"role": "user", "content": question}]
            turn, _ = await _chat(client, url, model, messages, out)
            turn.group, turn.index = g, i
            return turn

        jobs = [one(g, i, _words(suffix, rng)) for g in range(len(prefixes)) for i in range(size)]
        t0 = time.perf_counter()
        results = await asyncio.gather(*jobs)
        return list(results), time.perf_counter() - t0


def _token_counter(url: str, model: str):
    """Tokens of a text by the server's own tokenizer (/tokenize)."""
    import httpx

    def count(text: str) -> int:
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        return httpx.post(f"{url}/tokenize", json=body, timeout=60).json()["count"]

    return count


def _summary(label: str, turns: list[Turn], duration: float) -> dict:
    first = [t.ttft for t in turns if t.index == 0]
    rest = [t.ttft for t in turns if t.index > 0]
    return {
        "cache": label,
        "requests": len(turns),
        "first_ttft_ms": float(np.mean(first)) * 1000,
        "later_ttft_ms": float(np.mean(rest)) * 1000 if rest else float("nan"),
        "out_tok_s": sum(t.output_tokens for t in turns) / duration,
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "cached_tokens": sum(t.cached_tokens for t in turns),
        "duration_s": duration,
    }


def run_prefix_scenario(
    scenario: str,
    server_args: list[str],
    groups: int,
    group_size: int,
    prefix_tokens: int,
    suffix_tokens: int,
    output_len: int,
    rounds: int,
    seed: int,
    log=print,
    max_concurrency: int | None = None,
) -> list[dict]:
    """One summary row per run: cache on, then off, `rounds` times. max_concurrency: multi-turn
    conversations at once (None: all of them)."""
    import httpx

    rows = []
    for r in range(rounds):
        for label, extra in (("on", []), ("off", ["--no-enable-prefix-caching"])):
            log(f"[{scenario} round {r + 1}, cache {label}] starting tacit serve {' '.join(server_args + extra)}")
            with TacitServer([*server_args, *extra]) as server:
                url = server.url
                model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]

                count = _token_counter(url, model)
                if scenario == "multi-turn":
                    system = tool_definitions(prefix_tokens, count)
                    coro = _multi_turn(
                        url, model, system, groups, group_size, suffix_tokens, output_len, seed, max_concurrency
                    )
                else:  # each group its own prefix: tools, then its own words
                    base = tool_definitions(prefix_tokens // 2, count)
                    rng = np.random.default_rng(seed + 1)
                    prefixes = [f"{_words(prefix_tokens // 2, rng)}\n{base}" for _ in range(groups)]
                    coro = _shared_prefix(url, model, prefixes, group_size, suffix_tokens, output_len, seed)
                turns, duration = asyncio.run(coro)
                rows.append({"round": r + 1, **_summary(label, turns, duration)})
                log(
                    f"[{scenario} round {r + 1}, cache {label}] later TTFT {rows[-1]['later_ttft_ms']:.0f} ms, "
                    f"{rows[-1]['out_tok_s']:.1f} out tok/s, {rows[-1]['cached_tokens']} cached prompt tokens"
                )
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    """Cache on against cache off, round by round: how much lower the later requests' TTFT and
    how much higher the output throughput."""
    lines = []
    for r in sorted({row["round"] for row in rows}):
        on = next(x for x in rows if x["round"] == r and x["cache"] == "on")
        off = next(x for x in rows if x["round"] == r and x["cache"] == "off")
        lines.append(
            f"  round {r}: later-request TTFT {off['later_ttft_ms'] / on['later_ttft_ms']:.2f}x lower with the cache, "
            f"output tok/s {on['out_tok_s'] / off['out_tok_s']:.2f}x"
        )
    return lines
