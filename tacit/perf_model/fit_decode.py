"""The GEMM efficiency of the fused C++ decode path in situ, for fit.py: whole engine decode
steps of a synthetic Qwen3 (not one of the validated shapes), less what the rest of the model
predicts for the step's other operators and fixed costs, against the roofline time of its
projections and lm_head.

Why not the GEMV micro-benchmark alone: the same qwen3-100m weights streamed through the GEMV
kernel in a tight loop took 4.5 ms a pass, inside engine decode steps the fused decoder took
5.6-5.8 ms and lm_head 1.9 ms against 1.1 ms looped (batch 1, one thread, this machine): a
step's weights stream ~20% slower than a loop's, which the loop-fitted curve missed (dense
decode predicted -13% to -35% with it).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tacit.perf_model.efficiency import Profile
from tacit.perf_model.fit_small_ops import best_of_each
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import Op, StepShape, step_ops
from tacit.perf_model.roofline import op_time
from tacit.platforms.specs import HardwareSpec

# ~245 MB of bf16 weights (8 layers of 22 MB and a 65 MB tied vocabulary): beyond the 32 MB L3.
# 8 layers, not 4: with 4, an int8 step's layers were 1.7 ms of a 4.1 ms step (the bf16 lm_head
# the rest), and three fits put the int8 efficiency at 1 row at 0.66, 0.77 and 0.84.
CONFIG = dict(
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=2816,
    vocab_size=32000,
    tie_word_embeddings=True,
    max_position_embeddings=512,
)
ROWS = (1, 4, 16)
PROMPT, OUTPUT = 16, 24
MEAN_CONTEXT = PROMPT + (OUTPUT - 2) // 2  # a timed decode step's context, on average


def _build(root: Path) -> Path:
    from tacit.bench.random_model import write_random_model

    return write_random_model({"arch": "Qwen3Config", **CONFIG}, root / "fused-decode-bench")


def step_measures(
    path: Path, dtype: str, rows: tuple[int, ...] = ROWS, engine_dtype: str = "bfloat16"
) -> dict[int, Callable[[], float]]:
    """By batch size, a call that runs one decode of the model at `path` (PROMPT-token prompts)
    and returns its seconds a step; `dtype` the weights (int8: quantized at load), `engine_dtype`
    the engine's compute dtype. The engine loads (and warms up) once, here."""
    from tacit.bench.peers.tacit_engine import TacitBench
    from tacit.bench.workloads import random_prompts
    from tacit.config.engine_args import EngineArgs
    from tacit.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=str(path),
        dtype=engine_dtype,
        quantization="int8" if dtype == "int8" else "auto",
        num_kv_blocks=128,
        max_model_len=256,
    )
    bench = TacitBench(LLMEngine(engine_args=args))
    bench.latency(random_prompts([8], 512, seed=99), 4)

    def measure(b: int) -> Callable[[], float]:
        prompts = random_prompts([PROMPT] * b, 512, seed=b)
        return lambda: b / bench.latency(prompts, OUTPUT)["decode_tok_s"]

    return {b: measure(b) for b in rows}


def step_seconds(
    path: Path, dtype: str, repeats: int, rows: tuple[int, ...] = ROWS, engine_dtype: str = "bfloat16"
) -> dict[int, float]:
    """Best decode step seconds of the model at `path` by batch size, the sizes interleaved."""
    measures = step_measures(path, dtype, rows, engine_dtype)
    return dict(zip(measures, best_of_each(list(measures.values()), repeats)))


def _fitted(op: Op, dtype: str) -> bool:
    """The step's operators this curve is fitted to: its own dtype's linear-method GEMMs (lm_head
    stays bf16 in an int8 model and is predicted by the bf16 curve, fitted first)."""
    return op.is_gemm and not op.kernel and op.op_class != "experts" and op.weight_dtype == dtype


def fused_decode_curve(dtype: str, spec: HardwareSpec, partial: Profile, repeats: int) -> dict:
    """Efficiency by rows: roofline time of the fitted GEMMs / (step - the other operators as
    `partial` predicts them - the decode_fused fixed costs)."""
    shape = shape_from_hf({**CONFIG, "architectures": ["Qwen3ForCausalLM"]})
    with tempfile.TemporaryDirectory() as root:
        steps = step_seconds(_build(Path(root)), dtype, repeats)
    fixed = partial.step_overhead_s.get("decode_fused", 0.0)
    fixed += shape.num_layers * partial.layer_overhead_s.get("decode_fused", 0.0)
    effs = []
    for b, t in steps.items():
        ops = step_ops(shape, StepShape(b, 1, MEAN_CONTEXT), weight_dtype=dtype)
        roof = sum(
            max(o.flops / spec.peak_flops("bf16"), o.bytes / spec.memory_bandwidth.value)
            for o in ops
            if _fitted(o, dtype)
        )
        other = sum(op_time(o, spec, partial, True, "decode_fused").seconds for o in ops if not _fitted(o, dtype))
        effs.append(round(min(1.0, roof / max(t - other - fixed, 1e-9)), 4))
        print(
            f"  fused decode {dtype} rows {b}: step {t * 1e3:.2f} ms, others {other * 1e3:.2f}, eff {effs[-1]:.3f}",
            file=sys.stderr,
        )
    return {"rows": list(ROWS), "eff": effs}
