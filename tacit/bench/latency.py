"""`tacit bench latency`: TTFT and decode tok/s per batch size, against the bandwidth roofline."""

from __future__ import annotations

import torch

from tacit.bench.peers.base import BenchEngine
from tacit.bench.workloads import random_prompts


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step streams: every parameter once, except an embedding table that is only
    looked up (a GGUF model kept quantized multiplies its head by its own copy of the blocks and
    reads 1 row of the 57 MB bf16 table per token; tied to the head, the table is streamed)."""
    params = {id(p): p for p in model.parameters()}  # shared params counted once
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding) and not any(
            p is m.weight for o in model.modules() if o is not m for p in o.parameters(recurse=False)
        ):
            params.pop(id(m.weight), None)
    return sum(p.numel() * p.element_size() for p in params.values())


def run(
    engines: list[BenchEngine],
    batch_sizes: list[int],
    input_len: int,
    output_len: int,
    vocab: int,
    wbytes: int,
    read_GBps: float,
    repeats: int = 2,
    progress=print,
) -> list[dict]:
    """Engines alternate within each batch size, best of `repeats` each, so drift hits all alike."""
    for e in engines:  # warm-up: first-call allocations, kernel selection
        e.latency(random_prompts([8], vocab, seed=99), 3)
    rows = []
    for bs in batch_sizes:
        prompts = random_prompts([input_len] * bs, vocab, seed=bs)
        best: dict[str, dict] = {}
        for r in range(repeats):
            for e in engines:
                res = e.latency(prompts, output_len)
                if res is None:
                    continue
                progress(f"  batch {bs} round {r + 1}: {e.name} {res['decode_tok_s']:.1f} tok/s")
                if e.name not in best or res["decode_tok_s"] > best[e.name]["decode_tok_s"]:
                    best[e.name] = res
        for name, res in best.items():
            step_s = bs / res["decode_tok_s"]
            # A decode step streams every weight once; at these lengths KV reads are small beside it.
            gbps = wbytes / step_s / 1e9
            rows.append(
                {
                    "engine": name,
                    "batch_size": bs,
                    "ttft_ms": 1000 * res["ttft_s"],
                    "decode_tok_s": res["decode_tok_s"],
                    "step_ms": 1000 * step_s,
                    "GBps": gbps,
                    "roofline": gbps / read_GBps,
                }
            )
    return rows


def ratios(rows: list[dict], metric: str, key: str) -> dict[str, float]:
    """{'tacit/peer@key': ratio} for every peer row that has a tacit row with the same key."""
    out = {}
    tacit = {r[key]: r[metric] for r in rows if r["engine"] == "tacit"}
    for r in rows:
        if r["engine"] != "tacit" and r[key] in tacit:
            out[f"tacit/{r['engine']}@{key}={r[key]}"] = tacit[r[key]] / r[metric]
    return out
