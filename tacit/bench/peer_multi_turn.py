"""`tacit bench serve --scenario multi-turn --peer llama.cpp`: the multi-turn conversations against
tacit's server (prefix cache on) and llama.cpp's (llama-cpp-python's `llama_cpp.server` with its
RAM prompt cache, launch.py LlamaCppServer) on the same GGUF, alternating, --rounds times.

llama.cpp's server answers one request at a time, so both run the conversations one after
another (--max-concurrency, 1 unless given). Its API takes no `ignore_eos`: every request to it
bans the model's end-of-sequence tokens with `logit_bias` instead (which tacit refuses), so both
engines' answers are --output-len tokens and the histories the later turns resend are as long.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tacit.bench.launch import LlamaCppServer, TacitServer
from tacit.bench.prefix_scenarios import _multi_turn, _summary, _token_counter, tool_definitions


def gguf_of(server_args: list[str]) -> str:
    """The GGUF tacit serves (--model, else the default model): the file llama.cpp gets too."""
    from tacit.loader.default_model import resolve_default_model

    model = server_args[server_args.index("--model") + 1] if "--model" in server_args else str(resolve_default_model())
    if Path(model).suffix != ".gguf":
        raise ValueError(f"--peer llama.cpp needs a .gguf model (both engines serve the same file); got {model!r}")
    return model


def run_peer_multi_turn(
    server_args: list[str],
    python: str,
    groups: int,
    turns: int,
    prefix_tokens: int,
    suffix_tokens: int,
    output_len: int,
    rounds: int,
    seed: int,
    max_concurrency: int,
    log=print,
) -> list[dict]:
    """One row per run: tacit, then llama.cpp, `rounds` times."""
    import httpx

    from tacit.loader import open_model

    gguf = gguf_of(server_args)
    ban_eos = {"logit_bias": {str(t): -100 for t in open_model(gguf).eos_token_ids}}
    system = None
    rows = []
    for r in range(rounds):
        for engine in ("tacit", "llama.cpp"):
            log(f"[multi-turn round {r + 1}, {engine}] starting its server on {gguf}")
            if engine == "tacit":
                server = TacitServer(server_args if "--model" in server_args else ["--model", gguf, *server_args])
            else:
                server = LlamaCppServer(gguf, n_ctx=8192, python=python)
            with server:
                model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
                if system is None:  # counted by tacit's tokenizer, which runs first
                    system = tool_definitions(prefix_tokens, _token_counter(server.url, model))
                extra = ban_eos if engine == "llama.cpp" else None
                coro = _multi_turn(
                    server.url, model, system, groups, turns, suffix_tokens, output_len, seed, max_concurrency, extra
                )
                done, duration = asyncio.run(coro)
            row = _summary(engine, done, duration)
            rows.append({"round": r + 1, "engine": row.pop("cache"), **row})
            log(
                f"[multi-turn round {r + 1}, {engine}] later TTFT {rows[-1]['later_ttft_ms']:.0f} ms, "
                f"{rows[-1]['out_tok_s']:.1f} out tok/s"
            )
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    lines = []
    for r in sorted({row["round"] for row in rows}):
        tacit = next(x for x in rows if x["round"] == r and x["engine"] == "tacit")
        peer = next(x for x in rows if x["round"] == r and x["engine"] == "llama.cpp")
        lines.append(
            f"  round {r}: turns 2+ TTFT {peer['later_ttft_ms'] / tacit['later_ttft_ms']:.2f}x lower with tacit, "
            f"output tok/s {tacit['out_tok_s'] / peer['out_tok_s']:.2f}x"
        )
    return lines
