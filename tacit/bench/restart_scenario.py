"""`tacit bench serve --scenario restart`: what the prefix cache's disk tier is for. A server
answers --groups requests, each with its own --prefix-tokens prefix (tool definitions, then words
of its own) and a question, one after another; it is stopped (SIGTERM: it drains and, with the
disk tier, saves its cached blocks) and started again, and answers one new question per prefix,
one after another. Run with the tier (--kv-offloading-size --tier-gib, --kv-offloading-dir a
fresh temporary directory each round) and without it (the prefix cache still on), alternating,
--rounds times.

Reported per run: mean TTFT before the restart (every prefix computed) and after it (with the
tier, loaded from its files: the operating system's page cache may still hold them, as it
would after a real restart of the process but not of the machine).
"""

from __future__ import annotations

import asyncio
import tempfile

import numpy as np

from tacit.bench.launch import TacitServer
from tacit.bench.prefix_scenarios import Turn, _chat, _token_counter, _words, tool_definitions


async def _one_by_one(url: str, model: str, prefixes: list[str], phase: int, suffix: int, out: int, seed: int):
    import httpx

    rng = np.random.default_rng(seed * 10 + phase)
    turns: list[Turn] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(1200.0, connect=10.0)) as client:
        for g, prefix in enumerate(prefixes):
            messages = [{"role": "system", "content": prefix}, {"role": "user", "content": _words(suffix, rng)}]
            turn, _ = await _chat(client, url, model, messages, out)
            turn.group, turn.index = g, phase
            turns.append(turn)
    return turns


def run_restart_scenario(
    server_args: list[str],
    groups: int,
    prefix_tokens: int,
    suffix_tokens: int,
    output_len: int,
    rounds: int,
    seed: int,
    tier_gib: float,
    log=print,
) -> list[dict]:
    """One row per run: with the disk tier, then without, `rounds` times."""
    import httpx

    rows = []
    for r in range(rounds):
        for label in ("disk tier", "no tier"):
            with tempfile.TemporaryDirectory(prefix="tacit-kv-tier-") as tier_dir:
                extra = ["--kv-offloading-size", str(tier_gib), "--kv-offloading-dir", tier_dir]
                args = [*server_args, *(extra if label == "disk tier" else [])]
                turns: list[Turn] = []
                prefixes: list[str] = []
                for phase in (0, 1):  # before the restart, after it
                    log(f"[restart round {r + 1}, {label}] phase {phase}: tacit serve {' '.join(args)}")
                    with TacitServer(args) as server:
                        model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
                        if not prefixes:
                            base = tool_definitions(prefix_tokens // 2, _token_counter(server.url, model))
                            words = np.random.default_rng(seed + 1)
                            prefixes = [f"{_words(prefix_tokens // 2, words)}\n{base}" for _ in range(groups)]
                        coro = _one_by_one(server.url, model, prefixes, phase, suffix_tokens, output_len, seed)
                        turns += asyncio.run(coro)
            before = [t.ttft for t in turns if t.index == 0]
            after = [t for t in turns if t.index == 1]
            rows.append(
                {
                    "round": r + 1,
                    "tier": label,
                    "requests": len(turns),
                    "before_ttft_ms": float(np.mean(before)) * 1000,
                    "after_restart_ttft_ms": float(np.mean([t.ttft for t in after])) * 1000,
                    "after_prompt_tokens": sum(t.prompt_tokens for t in after),
                    "after_cached_tokens": sum(t.cached_tokens for t in after),
                }
            )
            log(
                f"[restart round {r + 1}, {label}] TTFT after the restart {rows[-1]['after_restart_ttft_ms']:.0f} ms, "
                f"{rows[-1]['after_cached_tokens']} cached prompt tokens"
            )
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    """With the tier against without, round by round: how much lower TTFT after the restart."""
    lines = []
    for r in sorted({row["round"] for row in rows}):
        on = next(x for x in rows if x["round"] == r and x["tier"] == "disk tier")
        off = next(x for x in rows if x["round"] == r and x["tier"] == "no tier")
        ratio = off["after_restart_ttft_ms"] / on["after_restart_ttft_ms"]
        lines.append(f"  round {r}: TTFT after a restart {ratio:.2f}x lower with the disk tier")
    return lines
