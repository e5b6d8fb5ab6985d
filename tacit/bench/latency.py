"""`tacit bench latency`: TTFT and decode tok/s per batch size, against the bandwidth roofline."""

from __future__ import annotations

from typing import Callable

import torch

from tacit.bench.peers.base import BenchEngine
from tacit.bench.workloads import random_prompts
from tacit.layers.moe import FusedMoE


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a decode step could stream: every parameter once, except an embedding
    table that is only looked up (a GGUF model kept quantized multiplies its head by its own copy
    of the blocks and reads 1 row of the 57 MB bf16 table per token; tied to the head, the table
    is streamed)."""
    params = {id(p): p for p in model.parameters()}  # shared params counted once
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding) and not any(
            p is m.weight for o in model.modules() if o is not m for p in o.parameters(recurse=False)
        ):
            params.pop(id(m.weight), None)
    return sum(p.numel() * p.element_size() for p in params.values())


def active_weight_bytes(model: torch.nn.Module, batch_size: int) -> int:
    """Bytes a decode step of `batch_size` tokens streams: weight_bytes, with each MoE layer's
    experts counted only as far as the step uses them. One token reads its top_k of E experts;
    b tokens read E * (1 - (1 - top_k/E)^b) distinct experts in expectation when routing is
    uniform (random weights route about uniformly; a trained router's skew reads fewer)."""
    total = weight_bytes(model)
    for m in model.modules():
        if isinstance(m, FusedMoE):
            e, k = m.num_experts, m.routing.top_k
            stacks = m.w13.nbytes + m.w2.nbytes
            used = e * (1 - (1 - k / e) ** batch_size)
            total -= int(stacks * (1 - used / e))
    return total


def run(
    engines: list[BenchEngine],
    batch_sizes: list[int],
    input_len: int,
    output_len: int,
    vocab: int,
    step_bytes: Callable[[int], int],
    read_GBps: float,
    repeats: int = 2,
    progress=print,
) -> list[dict]:
    """Engines alternate within each batch size, best of `repeats` each, so drift hits all alike."""
    for e in engines:  # warm-up: first-call allocations, kernel selection
        e.latency(random_prompts([8], vocab, seed=99), 3)
    rows = []
    for bs in batch_sizes:
        best: dict[str, dict] = {}
        for r in range(repeats):
            # New prompts every round: a repeat of the same ones would find them in tacit's prefix
            # cache (and a peer's prompt cache), and time a cached prefill as TTFT.
            prompts = random_prompts([input_len] * bs, vocab, seed=bs + 1000 * r)
            for e in engines:
                res = e.latency(prompts, output_len)
                if res is None:
                    continue
                progress(f"  batch {bs} round {r + 1}: {e.name} {res['decode_tok_s']:.1f} tok/s")
                if e.name not in best or res["decode_tok_s"] > best[e.name]["decode_tok_s"]:
                    best[e.name] = res
        for name, res in best.items():
            step_s = bs / res["decode_tok_s"]
            # A decode step streams every weight it uses once; at these lengths KV reads are small beside it.
            gbps = step_bytes(bs) / step_s / 1e9
            rows.append(
                {
                    "engine": name,
                    "batch_size": bs,
                    "ttft_ms": 1000 * res["ttft_s"],
                    "decode_tok_s": res["decode_tok_s"],
                    "step_ms": 1000 * step_s,
                    "GBps": gbps,
                    "roofline": gbps / read_GBps,
                    # Tensor parallel: the share of rank 0's decode time spent in its all-reduces.
                    **({"comm_share": res["comm_share"]} if "comm_share" in res else {}),
                    # And of its prefill time blocked in the torch path's collectives; the
                    # fraction of them hidden behind compute (--two-batch-overlap).
                    **{k: res[k] for k in ("prefill_comm_share", "prefill_comm_hidden") if k in res},
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
