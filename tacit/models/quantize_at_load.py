"""--quantization int8 | int4 on a Hugging Face checkpoint: which weights, and their conversion
as they stream in.

Quantized: the weights of the linear layers (q/k/v/o, gate/up/down, DeepSeek's q/kv_a
projections, shared experts). They become GGML-method layers (use_ggml_weights) before the
weights exist, and each checkpoint tensor is quantized as the loader yields it, so peak memory
is the quantized model plus one tensor in float32, never the whole model in bf16. A merged
layer (qkv, gate_up) is quantized shard by shard: each row is its own run of blocks.

Kept in the model's dtype:
- embeddings and norms (not linear layers);
- lm_head: the output logits are the most sensitive to weight error (llama.cpp likewise keeps
  output.weight at Q6_K / Q8_0 in its 4-bit types), and a tied head is the embedding table;
- the linear layers a model reads directly (CausalLM.dense_weight_linears: a MoE router's
  F.linear, DeepSeek's absorbed kv_b_proj);
- MoE expert weights: FusedMoE holds them as stacked [E, 2I, H] parameters multiplied by the
  MoE kernel, not through LinearBase, so they stay in the model's dtype, with a message.
"""

from __future__ import annotations

import sys
from typing import Iterator

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.kernels.ggml_quant import QK, GGMLTensor
from tacit.kernels.weight_quant import (
    INT4_GROUP_SIZES,
    Q4_1,
    Q8_0,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
)
from tacit.layers.linear import LinearBase, checkpoint_weight_names
from tacit.layers.moe import FusedMoE

_KEPT = ("lm_head",)  # see the module docstring


def quantization_plan(model: nn.Module, cfg: ModelConfig) -> dict[str, int]:
    """{HF weight name: GGML type} of the checkpoint tensors cfg.quantization quantizes, for a
    model built on the meta device. A layer whose inputs are not whole groups is a ValueError
    naming it and the valid group sizes, before anything is allocated."""
    int8 = cfg.quantization == "int8"
    ggml_type, group = (Q8_0, QK) if int8 else (Q4_1, cfg.quantization_group_size)
    kept = _KEPT + tuple(getattr(model, "dense_weight_linears", ()))
    layers = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, LinearBase) and name not in _KEPT and not name.endswith(kept)
    ]
    ragged = [f"{name} ({m.in_features} inputs)" for name, m in layers if m.in_features % group]
    if ragged:
        shown = ", ".join(ragged[:4]) + (f" and {len(ragged) - 4} more" if len(ragged) > 4 else "")
        if int8:
            raise ValueError(
                f"quantization='int8' stores each row as 32-value Q8_0 blocks; {shown}: inputs not a multiple of 32"
            )
        fits = [g for g in INT4_GROUP_SIZES if all(m.in_features % g == 0 for _, m in layers)]
        raise ValueError(
            f"quantization='int4' with quantization_group_size={group}: {shown}: inputs not a multiple of {group}; "
            f"valid group sizes: {', '.join(map(str, INT4_GROUP_SIZES))}, one that divides every quantized "
            f"layer's inputs" + (f" (here: {', '.join(map(str, fits))})" if fits else " (none does here)")
        )
    experts = [name for name, m in model.named_modules() if isinstance(m, FusedMoE)]
    if experts:
        print(
            f"tacit: quantization={cfg.quantization}: MoE expert weights ({len(experts)} FusedMoE layers) "
            f"stay in {str(cfg.dtype).removeprefix('torch.')}; only linear layers are quantized at load",
            file=sys.stderr,
        )
    return {n: ggml_type for name, m in layers for n in checkpoint_weight_names(name, m)}


def quantized_as_loaded(
    tensors: Iterator[tuple[str, torch.Tensor | GGMLTensor]], plan: dict[str, int], group: int
) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
    """The checkpoint's tensors, those named in `plan` quantized one at a time as they stream by."""
    for name, tensor in tensors:
        ggml_type = plan.get(name)
        if ggml_type is not None and isinstance(tensor, torch.Tensor):
            try:
                if ggml_type == Q8_0:
                    tensor = quantize_int8_per_channel(tensor)
                else:
                    tensor = quantize_int4_groupwise(tensor, group)
            except ValueError as e:
                raise ValueError(f"checkpoint tensor {name!r}: {e}") from None
        yield name, tensor
