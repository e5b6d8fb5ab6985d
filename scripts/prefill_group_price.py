"""torch_paged's prefill attention for a step's chunks, timed, against the step model's price of
it: the backend's one group (step_model.torch_paged_prefill_scores) and each chunk on its own.

The chunks are steps of the bursty-priority replay (scripts/replay_step_prices.py --json), the
heads the default model's (SmolLM2-135M: 9 query heads, 3 KV heads of 64), float32 16-token
blocks, four layers' caches a call, best of --repeats; the price is the this-cpu fit's, per layer.

    python scripts/prefill_group_price.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import torch

from tacit.config.engine_args import EngineArgs
from tacit.kernels.torch_attention import TorchAttentionBackend
from tacit.loader.default_model import resolve_default_model
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_times
from tacit.tune.model_stage import ModelStage
from tacit.tune.scenario import load_scenario
from tacit.tune.space import validate_point

BLOCK, LAYERS = 16, 4
# (new tokens, cached context) of each prefill chunk
STEPS = {
    "512 on 0": [(512, 0)],
    "512 on 512": [(512, 512)],
    "4 x 64 on 0": [(64, 0)] * 4,
    "512 on 512, 155 on 0": [(512, 512), (155, 0)],
    "512, 100, 52 on 0": [(512, 0), (100, 0), (52, 0)],
    "8 chunks, 1,347 tokens": [(419, 512), (32, 0), (45, 0), (207, 0), (34, 0), (34, 0), (64, 0), (512, 0)],
}


def measured_seconds(chunks: list[tuple[int, int]], heads: tuple[int, int, int], repeats: int) -> float:
    hq, hkv, d = heads
    n, c = np.array([a for a, _ in chunks]), np.array([b for _, b in chunks])
    blocks = -(-(n + c) // BLOCK)
    tables = np.zeros((len(chunks), int(blocks.max())), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(blocks)])
    for i, b in enumerate(blocks):
        tables[i, :b] = np.arange(starts[i], starts[i] + b)
    pos = [c[i] + np.arange(n[i]) for i in range(len(chunks))]
    slots = np.concatenate([tables[i, p // BLOCK] * BLOCK + p % BLOCK for i, p in enumerate(pos)])
    backend = TorchAttentionBackend()
    meta = backend.build_metadata(n, c, tables, slots, torch.device("cpu"), BLOCK)
    caches = [torch.randn(2, int(starts[-1]), BLOCK, hkv, d) for _ in range(LAYERS)]
    q, kv = torch.randn(int(n.sum()), hq, d), torch.randn(int(n.sum()), hkv, d)

    def call() -> None:
        for cache in caches:
            backend.write_kv(cache, kv, kv, meta)
            backend.forward(q, cache, meta, d**-0.5)

    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, (time.perf_counter() - start) / LAYERS)
    return best


def priced_seconds(p: Pricing, chunks: list[tuple[int, int]]) -> float:
    step = MixedStep([Chunk(a, b, True) for a, b in chunks])
    return sum(t.seconds for t in mixed_step_times(p, step)[1] if t.op.name == "attention") / p.shape.num_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = str(resolve_default_model())
    base = EngineArgs(model=model)
    stage = ModelStage(base, model, load_scenario("bursty-priority"), "goodput")
    grouped = stage._pricing(validate_point({}, base))
    each = replace(grouped, prefill_one_group=False)
    s = grouped.shape
    heads = (s.num_heads, s.num_kv_heads, s.head_dim)
    print(f"{'chunks':>24}  measured ms/layer  one group  chunks each")
    for name, chunks in STEPS.items():
        t = measured_seconds(chunks, heads, args.repeats)
        g, e = priced_seconds(grouped, chunks), priced_seconds(each, chunks)
        print(
            f"{name:>24}  {t * 1e3:8.2f}  {g * 1e3:8.2f} ({100 * (g / t - 1):+4.0f}%)  {e * 1e3:8.2f} ({100 * (e / t - 1):+4.0f}%)"
        )


if __name__ == "__main__":
    main()
