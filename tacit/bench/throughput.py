"""`tacit bench throughput`: N offline requests with lengths from a named distribution."""

from __future__ import annotations

from tacit.bench.peers.base import BenchEngine
from tacit.bench.workloads import random_prompts, sample_lengths


def run(
    engines: list[BenchEngine],
    num_prompts: int,
    dist: str,
    input_len: int,
    output_len: int,
    vocab: int,
    max_model_len: int,
    repeats: int = 1,
    progress=print,
) -> list[dict]:
    pairs = sample_lengths(dist, num_prompts, input_len, output_len, seed=0, max_total=max_model_len - 1)
    best: dict[str, dict] = {}
    for r in range(repeats):
        # New prompts (same lengths) every round: the same ones again would be prefix-cache hits.
        prompts = random_prompts([i for i, _ in pairs], vocab, seed=r)
        requests = [(p, o) for p, (_, o) in zip(prompts, pairs)]
        for e in engines:
            res = e.throughput(requests)
            if res is None:  # a peer that crashed or hung: reported by the caller
                continue
            progress(f"  round {r + 1}: {e.name} {res['output_tok_s']:.1f} output tok/s")
            if e.name not in best or res["output_tok_s"] > best[e.name]["output_tok_s"]:
                best[e.name] = res
    ins = sorted(i for i, _ in pairs)
    outs = sorted(o for _, o in pairs)
    return [
        {
            "engine": name,
            "dist": dist,
            "requests": num_prompts,
            "input_p50": ins[len(ins) // 2],
            "input_max": ins[-1],
            "output_p50": outs[len(outs) // 2],
            "output_max": outs[-1],
            **res,
        }
        for name, res in best.items()
    ]
