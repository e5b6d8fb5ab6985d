"""The torch decode path's fixed cost per step and per layer, for fit.py: whole engine decode
steps of a synthetic DeepSeek-V3 (MLA and MoE layers run one by one in torch, their kernels C++
calls inside) at two depths, less what the profile predicts for the step's operators, fitted as
a + b * layers on what is left.

Why 256 wide: what is left is the difference of two measured steps and their predicted
operators, so any mismatch between the GEMM curve (timed earlier in the fit, in another state of
the shared machine) and the step's own GEMMs lands in it. At 1,024 wide a dense Qwen3's operators
are 70% of its step and four fits on an AVX2 EPYC put its fixed cost at 0.21, 0.85, 0.70 and 0.84
ms a layer; at 256 wide they are 15-25% of it and two fits read 0.67 and 0.70 (0.56 and 0.61 at
128 wide). DeepSeek-V3's layer read 1.34 and 1.19 ms at 768 wide, 1.37 and 1.17 at 256: the
fixed cost does not grow with the width there. Narrower still is too narrow: on the bf16 host a
64-wide DeepSeek-V3 put it at 0.16-0.26 ms a layer and `tacit predict --validate` then had
deepseek-v3-1b's decode steps 17-20% slower than predicted. The synthetic shapes here are not
validated ones.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from tacit.perf_model.efficiency import Profile
from tacit.perf_model.fit_decode import MEAN_CONTEXT, step_measures
from tacit.perf_model.fit_host import engine_dtype
from tacit.perf_model.fit_small_ops import best_of_each
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import StepShape, step_ops
from tacit.perf_model.roofline import op_time
from tacit.platforms.specs import HardwareSpec

CONFIG = dict(
    hidden_size=256,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=128,
    qk_rope_head_dim=32,
    qk_nope_head_dim=64,
    v_head_dim=64,
    intermediate_size=704,
    moe_intermediate_size=128,
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
# A dense Qwen3 (its layer is the fewest torch ops) and a Qwen3-MoE (GQA with routed experts: a
# narrow one's layer read 0.93 and 0.90 ms where DeepSeek's read 1.37 and 1.17), the same width
DENSE_CONFIG = dict(
    arch="Qwen3Config",
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    intermediate_size=704,
    vocab_size=8000,
    tie_word_embeddings=True,
    max_position_embeddings=512,
)
MOE_CONFIG = dict(
    DENSE_CONFIG,
    arch="Qwen3MoeConfig",
    moe_intermediate_size=128,
    num_experts=16,
    num_experts_per_tok=4,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)
DEPTHS = (2, 5)  # the first layer is dense: two depths past it give the per-layer slope
GQA_DEPTHS = (2, 6)  # the Qwen3s' layers are all alike


# A step's rows: one, and a batch the validation and serving reach (16), for the per-row cost
ROWS = (1, 16)


class TorchOverheads(NamedTuple):
    """Seconds of a torch-path decode step beyond its operators: per step and per layer (at one
    row), and per row past the first and per such row and layer."""

    step: float
    layer: float
    row: float
    row_layer: float


def torch_decode_overheads(
    spec: HardwareSpec,
    partial: Profile,
    repeats: int,
    dtype: str = "bf16",
    config: dict | None = None,
    depths: tuple[int, int] = DEPTHS,
) -> TorchOverheads:
    """Torch-path decode steps at two depths and ROWS rows beyond their operators, the engine
    computing in `dtype` (bf16, or fp32 on a CPU without a native bf16 matmul), on the synthetic
    DeepSeek-V3 above or another `config` ({"arch": transformers config class, ...})."""
    from tacit.bench.random_model import write_random_model

    config = config or {"arch": "DeepseekV3Config", **CONFIG}
    architecture = config["arch"].removesuffix("Config") + "ForCausalLM"
    shapes, measures, points = {}, [], []
    with tempfile.TemporaryDirectory() as root:
        for layers in depths:  # every engine loaded, then measured in turn (best_of_each)
            cfg = {**config, "num_hidden_layers": layers}
            path = write_random_model(cfg, Path(root) / f"model-{layers}")
            by_rows = step_measures(path, dtype, ROWS, engine_dtype(dtype))
            measures += [by_rows[r] for r in ROWS]
            points += [(layers, r) for r in ROWS]
            hf = {k: v for k, v in cfg.items() if k != "arch"}
            shapes[layers] = shape_from_hf({**hf, "architectures": [architecture]})
        steps = best_of_each(measures, repeats)
    residual: dict[int, dict[int, float]] = {r: {} for r in ROWS}
    for (layers, rows), t in zip(points, steps):
        ops = step_ops(shapes[layers], StepShape(rows, 1, MEAN_CONTEXT), weight_dtype=dtype, kv_dtype=dtype)
        predicted = sum(op_time(o, spec, partial, True, "torch").seconds for o in ops)
        residual[rows][layers] = t - predicted
        print(
            f"  torch decode {architecture} {layers} layers, {rows} rows: step {t * 1e3:.2f} ms, "
            f"operators {predicted * 1e3:.2f}",
            file=sys.stderr,
        )
    one, many = ROWS
    extra = {layers: (residual[many][layers] - residual[one][layers]) / (many - one) for layers in depths}
    return TorchOverheads(*per_step_and_layer(residual[one]), *per_step_and_layer(extra))


def per_step_and_layer(residual: dict[int, float]) -> tuple[float, float]:
    """a + b * layers through the seconds left over at two depths, neither negative."""
    (l1, r1), (l2, r2) = sorted(residual.items())
    per_layer = max((r2 - r1) / (l2 - l1), 0.0)
    return round(max(r1 - l1 * per_layer, 0.0), 7), round(per_layer, 7)
