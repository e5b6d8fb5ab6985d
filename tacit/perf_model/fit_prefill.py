"""The fixed cost of a step with prompt tokens, per step and per layer, for fit.py: the TTFT of
one short prompt on a synthetic Qwen3 at two depths, less what the profile predicts for the
step's operators, fitted as a + b * layers on what is left.

Why its own fit: a prompt runs the torch path (one Python call per layer and per op, the
attention metadata, the KV writes, the first token's sampling), and the decode steps the
torch-path fixed cost is fitted on (fit_torch_decode.py) put it at ~0 on this machine
("torch decode 2 layers: step 1.59 ms, operators 1.98"). With that, `tacit predict --validate`
priced every 32-token prompt 14-49% under what the engine took (qwen3-100m: 18.4 ms predicted,
36.1 measured) while the 256-4096-token prefills were within +-30% either way. PROMPT is that
short length, where the fixed cost is the largest share.

The model is fit_torch_decode's 256-wide dense Qwen3, for the reason given there: at 1,024 wide
a 32-token prompt's operators were 75-80% of its TTFT, and four fits on an AVX2 EPYC put the
fixed cost at 2.30, 3.66, 3.10 and 0.81 ms a layer; at 256 wide (operators 25-30%) two fits read
1.17 and 0.80. With 3.66, `random:qwen3-100m`'s 32-token prefill read +40% in the validation.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tacit.perf_model.efficiency import Profile
from tacit.perf_model.fit_host import engine_dtype
from tacit.perf_model.fit_small_ops import best_of_each
from tacit.perf_model.fit_torch_decode import DENSE_CONFIG, GQA_DEPTHS, per_step_and_layer
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_times
from tacit.platforms.specs import HardwareSpec

CONFIG = {k: v for k, v in DENSE_CONFIG.items() if k != "arch"}
DEPTHS = GQA_DEPTHS
PROMPT = 32


def _ttft_measure(path: Path, torch_name: str = "bfloat16") -> Callable[[], float]:
    """A call that prefills one PROMPT-token prompt on the model at `path` and returns its TTFT
    (the engine loaded and warmed up once, here)."""
    from tacit.bench.peers.tacit_engine import TacitBench
    from tacit.bench.workloads import random_prompts
    from tacit.config.engine_args import EngineArgs
    from tacit.engine.llm_engine import LLMEngine

    # No prefix cache: each repeat's prompt must be computed, not found (the validation's too)
    args = EngineArgs(
        model=str(path), dtype=torch_name, num_kv_blocks=64, max_model_len=256, enable_prefix_caching=False
    )
    bench = TacitBench(LLMEngine(engine_args=args))
    bench.latency(random_prompts([PROMPT], 8000, seed=99), 2)  # warm-up
    prompts = random_prompts([PROMPT], 8000, seed=1)
    return lambda: bench.latency(prompts, 2)["ttft_s"]


def prefill_overheads(spec: HardwareSpec, partial: Profile, repeats: int, dtype: str = "bf16") -> tuple[float, float]:
    """(per step, per layer) seconds of a PROMPT-token prefill step beyond its operators, the
    engine computing in `dtype` (bf16, or fp32 on a CPU without a native bf16 matmul); the two
    depths' engines both loaded and measured in turn (best_of_each)."""
    from tacit.bench.random_model import write_random_model

    measures = []
    with tempfile.TemporaryDirectory() as root:
        for layers in DEPTHS:
            cfg = {**CONFIG, "num_hidden_layers": layers}
            path = write_random_model({"arch": "Qwen3Config", **cfg}, Path(root) / f"qwen3-{layers}")
            measures.append(_ttft_measure(path, engine_dtype(dtype)))
        ttfts = best_of_each(measures, repeats)
    residual = {}
    for layers, t in zip(DEPTHS, ttfts):
        cfg = {**CONFIG, "num_hidden_layers": layers}
        shape = shape_from_hf({**cfg, "architectures": ["Qwen3ForCausalLM"]})
        pricing = Pricing(shape, spec, partial, dtype, dtype)
        _, times = mixed_step_times(pricing, MixedStep([Chunk(PROMPT, 0, True)]))
        predicted = sum(x.seconds for x in times)
        residual[layers] = t - predicted
        print(
            f"  prefill {PROMPT} tokens, {layers} layers: step {t * 1e3:.2f} ms, operators {predicted * 1e3:.2f}",
            file=sys.stderr,
        )
    return per_step_and_layer(residual)
