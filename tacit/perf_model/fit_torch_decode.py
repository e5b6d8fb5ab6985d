"""The torch decode path's fixed cost per step and per layer, for fit.py: whole engine decode
steps of a synthetic DeepSeek-V3 (MLA and MoE layers run one by one in torch, their kernels C++
calls inside) at two depths, less what the profile predicts for the step's operators, fitted as
a + b * layers on what is left.

Why not tiny 64-wide models as the fused path's fixed costs are fitted: the 64-wide DeepSeek-V3
put the torch path's cost at 0.16-0.26 ms a layer, and `tacit predict --validate` then had
deepseek-v3-1b's decode steps 17-20% slower than predicted at every batch size and dtype: at a
real width each layer's dozen small torch ops and C++ calls cost more than their bytes. The
synthetic shape here is not a validated one (768 wide, 16 experts).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tacit.perf_model.efficiency import Profile
from tacit.perf_model.fit_decode import MEAN_CONTEXT, step_measures
from tacit.perf_model.fit_host import engine_dtype
from tacit.perf_model.fit_small_ops import best_of_each
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import StepShape, step_ops
from tacit.perf_model.roofline import op_time
from tacit.platforms.specs import HardwareSpec

CONFIG = dict(
    hidden_size=768,
    first_k_dense_replace=1,
    num_attention_heads=12,
    num_key_value_heads=12,
    q_lora_rank=384,
    kv_lora_rank=256,
    qk_rope_head_dim=32,
    qk_nope_head_dim=64,
    v_head_dim=64,
    intermediate_size=2048,
    moe_intermediate_size=256,
    n_routed_experts=16,
    n_shared_experts=1,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    vocab_size=8000,
    tie_word_embeddings=False,
    max_position_embeddings=512,
)
DEPTHS = (2, 5)  # the first layer is dense: two depths past it give the per-layer slope


def torch_decode_overheads(
    spec: HardwareSpec,
    partial: Profile,
    repeats: int,
    dtype: str = "bf16",
    config: dict | None = None,
    depths: tuple[int, int] = DEPTHS,
) -> tuple[float, float]:
    """(per step, per layer) seconds of batch-1 torch-path decode steps beyond their operators,
    the engine computing in `dtype` (bf16, or fp32 on a CPU without a native bf16 matmul), on
    the synthetic DeepSeek-V3 above or another `config` ({"arch": transformers config class, ...})."""
    from tacit.bench.random_model import write_random_model

    config = config or {"arch": "DeepseekV3Config", **CONFIG}
    architecture = config["arch"].removesuffix("Config") + "ForCausalLM"
    residual, shapes, measures = {}, {}, []
    with tempfile.TemporaryDirectory() as root:
        for layers in depths:  # both engines loaded, then measured in turn (best_of_each)
            cfg = {**config, "num_hidden_layers": layers}
            path = write_random_model(cfg, Path(root) / f"model-{layers}")
            measures.append(step_measures(path, dtype, (1,), engine_dtype(dtype))[1])
            hf = {k: v for k, v in cfg.items() if k != "arch"}
            shapes[layers] = shape_from_hf({**hf, "architectures": [architecture]})
        steps = best_of_each(measures, repeats)
    for layers, t in zip(depths, steps):
        ops = step_ops(shapes[layers], StepShape(1, 1, MEAN_CONTEXT), weight_dtype=dtype, kv_dtype=dtype)
        predicted = sum(op_time(o, spec, partial, True, "torch").seconds for o in ops)
        residual[layers] = t - predicted
        print(
            f"  torch decode {architecture} {layers} layers: step {t * 1e3:.2f} ms, operators {predicted * 1e3:.2f}",
            file=sys.stderr,
        )
    return per_step_and_layer(residual)


def per_step_and_layer(residual: dict[int, float]) -> tuple[float, float]:
    """a + b * layers through the seconds left over at two depths, neither negative."""
    (l1, r1), (l2, r2) = sorted(residual.items())
    per_layer = max((r2 - r1) / (l2 - l1), 0.0)
    return round(max(r1 - l1 * per_layer, 0.0), 7), round(per_layer, 7)
