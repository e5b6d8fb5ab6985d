"""`tacit bench spec`: decode tok/s with speculative decoding against without, on the same model
in one process, alternating, on docs/workloads/spec-decode.jsonl's prompts:

- repetitive: rewrite or edit a ~400-token code file, JSON document or SQL schema and return it
  whole (most of the answer is in the prompt: what prompt-lookup drafts are for);
- chat: ordinary questions (drafts are rarely right: the draft length controller must keep
  speculation from costing anything);
- mixed: both kinds together at batch 16.

Each repeat takes the next prompts of its kind (the same for both engines), so a proposer that
learns from finished requests never sees the answer it is asked for. Every run is greedy with
ignore_eos and --output-len tokens, so with and without speculation
must produce the same tokens: each run's are compared, and a difference is reported as
`identical: false`. decode tok/s = tokens after each request's first / (time after the batch's
first tokens), as `tacit bench latency` counts it.

--peer llama.cpp adds llama-cpp-python on the same GGUF, with and without its prompt-lookup
decoding (LlamaPromptLookupDecoding, --lookup-tokens N each), one request at a time (its API
runs one sequence), each in its own process.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

WORKLOAD = Path(__file__).resolve().parents[2] / "docs" / "workloads" / "spec-decode.jsonl"
KINDS = ("repetitive", "chat", "mixed")


def load_prompts(tokenizer, path: Path = WORKLOAD) -> dict[str, list[list[int]]]:
    """{kind: [chat-templated prompt ids]} for the repetitive and chat prompts of the workload; a
    model without a chat template (random:NAME checkpoints) gets the messages' texts, one a line."""
    out: dict[str, list[list[int]]] = {"repetitive": [], "chat": []}

    def encode(messages: list[dict]) -> list[int]:
        if tokenizer.chat_template:
            return tokenizer.encode_chat(messages)
        return tokenizer.encode("\n".join(str(m.get("content", "")) for m in messages) + "\n")

    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if row.get("kind") not in out or not isinstance(row.get("messages"), list):
                raise ValueError(f"{path}:{i}: needs kind repetitive or chat and a messages list")
            out[row["kind"]].append(encode(row["messages"]))
    empty = [k for k, v in out.items() if not v]
    if empty:
        raise ValueError(f"{path} has no {' or '.join(empty)} prompts")
    return out


def batch_of(prompts: dict[str, list[list[int]]], kind: str, size: int, start: int = 0) -> list[list[int]]:
    """`size` prompts of `kind` (mixed: the two kinds alternating) from the start-th on, cycling
    through the workload."""
    pool = (
        [p for pair in zip(prompts["repetitive"] * 2, prompts["chat"]) for p in pair]
        if kind == "mixed"
        else prompts[kind]
    )
    return [pool[(start + i) % len(pool)] for i in range(size)]


def generate(engine, prompts: list[list[int]], output_len: int) -> tuple[dict[str, float], list[list[int]]]:
    """One batch, greedy -> ({ttft_s, decode_tok_s, accepted per verify...}, each request's tokens)."""
    from tacit.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    stats0 = engine.get_stats()
    t0 = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    t_first = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        if t_first is None and all(tokens[i] for i in ids):
            t_first = time.perf_counter()
    total = time.perf_counter() - t0
    stats = engine.get_stats()
    drafts = stats.spec_decode_num_draft_tokens - stats0.spec_decode_num_draft_tokens
    accepted = stats.spec_decode_num_accepted_tokens - stats0.spec_decode_num_accepted_tokens
    verifies = stats.spec_decode_num_drafts - stats0.spec_decode_num_drafts
    row = {
        "ttft_s": t_first - t0,
        "decode_tok_s": len(prompts) * (output_len - 1) / (total - (t_first - t0)),
        "draft_tokens": drafts,
        "acceptance": accepted / drafts if drafts else 0.0,
        "mean_accepted_length": 1 + accepted / verifies if verifies else 1.0,
    }
    return row, [tokens[i] for i in ids]


def run(
    engines: dict[str, object],
    prompts: dict[str, list[list[int]]],
    cases: list[tuple[str, int]],
    output_len: int,
    repeats: int,
    peers: list = (),
    progress=print,
) -> list[dict]:
    """engines: {"off": LLMEngine, "on": LLMEngine}, alternated each repeat; peers (BenchEngine,
    batch 1 only) after them. One row per (case, engine, repeat)."""
    rows = []
    for kind, size in cases:
        for r in range(repeats):
            # Each repeat its own prompts: a proposer that learns from finished requests (suffix)
            # would otherwise draft a repeat's answer from the one before.
            batch = batch_of(prompts, kind, size, r * size)
            outputs = {}
            for label, engine in engines.items():
                progress(f"[{kind} batch {size} repeat {r + 1}] speculation {label}")
                row, outputs[label] = generate(engine, batch, output_len)
                rows.append({"workload": kind, "batch_size": size, "engine": f"tacit {label}", "repeat": r + 1, **row})
            rows[-1]["identical"] = outputs["on"] == outputs["off"]
            if size == 1:
                for peer in peers:
                    progress(f"[{kind} batch 1 repeat {r + 1}] {peer.name}")
                    got = peer.latency(batch, output_len)
                    if got is not None:
                        rows.append({"workload": kind, "batch_size": 1, "engine": peer.name, "repeat": r + 1, **got})
    return rows


def medians(rows: list[dict]) -> dict[str, dict[str, float]]:
    """{"workload batch N": {engine: median decode tok/s over the repeats}} (--plot's bars)."""
    from statistics import median

    out: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        out.setdefault(f"{r['workload']} batch {r['batch_size']}", {}).setdefault(r["engine"], []).append(
            r["decode_tok_s"]
        )
    return {case: {e: median(v) for e, v in engines.items()} for case, engines in out.items()}


def ratios(rows: list[dict]) -> list[str]:
    """Per case: tacit on over off (median of the repeats' pairs), and over each peer's best."""
    from statistics import median

    lines = []
    for kind, size in dict.fromkeys((r["workload"], r["batch_size"]) for r in rows):
        case = [r for r in rows if (r["workload"], r["batch_size"]) == (kind, size)]
        on = {r["repeat"]: r["decode_tok_s"] for r in case if r["engine"] == "tacit on"}
        off = {r["repeat"]: r["decode_tok_s"] for r in case if r["engine"] == "tacit off"}
        pairs = [on[k] / off[k] for k in on if k in off]
        same = all(r.get("identical", True) for r in case)
        line = f"  {kind} batch {size}: speculation {median(pairs):.2f}x of off (pairs {', '.join(f'{p:.2f}' for p in pairs)})"
        line += ", output identical" if same else ", OUTPUT DIFFERS"
        peers = {r["engine"] for r in case} - {"tacit on", "tacit off"}
        for peer in sorted(peers):
            best = max(r["decode_tok_s"] for r in case if r["engine"] == peer)
            line += f"; {median(on.values()) / best:.2f}x {peer}"
        lines.append(line)
    return lines
