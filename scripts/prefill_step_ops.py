"""One cold prefill step of a `tacit predict --validate` configuration: the step model's operators
under this machine's calibration against the engine's measured TTFT and its matrix products
timed by torch.profiler, grouped by weight shape (an MoE's experts are its [hidden, 2 x moe] and
[moe, hidden] products). Where a validation row misses, this says whether an operator or the
host time around them does. Float32 only: the engine and the price both, as --validate runs on a
CPU without a native bf16 matmul.

    python scripts/prefill_step_ops.py [--model random:qwen3-moe-2b] [--batch 1] [--input-len 32]
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import replace

from torch.profiler import ProfilerActivity, profile

from tacit.bench.random_model import ensure_random_model
from tacit.bench.workloads import random_prompts
from tacit.perf_model import validate
from tacit.perf_model.calibration import this_cpu_profile
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_times
from tacit.platforms.hardware_table import get_hardware_spec

PRODUCTS = ("aten::mm", "aten::addmm", "aten::addmv", "aten::bmm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:qwen3-moe-2b", help="a validation model (validate.PLAN)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    profile_ = this_cpu_profile()
    bench = validate._engine(a.model, "fp32", "float32")
    draws = validate.routing_draws(bench) if validate._is_moe(a.model) else ()
    shape = replace(shape_from_hf(load_hf_config(str(ensure_random_model(a.model)))), routing_draws=draws)
    pricing = Pricing(shape, get_hardware_spec("this-cpu"), profile_, "fp32", "fp32", padded_decode_block=16)
    step, ops = mixed_step_times(pricing, MixedStep([Chunk(a.input_len, 0, True)] * a.batch))
    print(f"priced: step {step * 1e3:.1f} ms, operators {sum(o.seconds for o in ops) * 1e3:.1f}")
    for o in ops:
        print(f"  {o.op.name:20s} {o.seconds * 1e3:9.2f} ms  {o.op.launches:5.0f} launches  rows {o.op.rows:.1f}")
    prompts = random_prompts([a.input_len] * a.batch, 32000, seed=a.batch)
    ttfts = [bench.latency(prompts, 1)["ttft_s"] * 1e3 for _ in range(a.repeats)]
    print("measured TTFT ms:", " ".join(f"{t:.1f}" for t in ttfts))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        ttft = bench.latency(prompts, 1)["ttft_s"]
    print(f"under the profiler: TTFT {ttft * 1e3:.1f} ms")
    by_weight: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key in PRODUCTS:
            row = by_weight[(e.key, str(e.input_shapes[1]) if len(e.input_shapes) > 1 else "")]
            row[0] += e.count
            row[1] += e.self_cpu_time_total / 1e3
    for (name, weight), (calls, ms) in sorted(by_weight.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name} weight {weight}: {calls:.0f} calls, {ms:.1f} ms")
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e3
    print(f"  all ops' self time {total:.1f} ms")


if __name__ == "__main__":
    main()
