"""Binders: how each model family's layers are handed to the fused C++ decode step.

The model runner asks build_fused_decoder for the step; the binder is picked by the model's
architecture (its class name, config.json's "architectures" entry). An architecture with no
binder, or a model its binder cannot run (say, float32 weights), keeps the torch path.
Importing this package registers every binder.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from torch import nn

from tacit.worker.paths.fused_binders import deepseek_v3, llama  # noqa: F401  (register their binders)
from tacit.worker.paths.fused_binders.base import FUSED_DECODER_BINDERS, FusedDecoderBinder


def binder_for(model: nn.Module) -> FusedDecoderBinder | None:
    """The binder of this model's architecture, or None where no binder serves it."""
    cls = FUSED_DECODER_BINDERS.get(type(model).__name__)
    return None if cls is None else cls()


def fused_decoder_unsupported_reason(model: nn.Module) -> str | None:
    """Why the fused step cannot run this model's decode step, or None if it can."""
    binder = binder_for(model)
    if binder is None:
        return (
            f"{type(model).__name__} has no fused decode step (architectures with one: "
            f"{', '.join(sorted(FUSED_DECODER_BINDERS))})"
        )
    return binder.unsupported_reason(model)


def build_fused_decoder(
    model: nn.Module,
    kernels: ModuleType | None,
    block_size: int,
    max_positions: int,
    ggml_int8_activations: bool = True,
) -> Any | None:
    """The C++ decode step bound to this model's weights and KV caches, or None if it cannot
    run it (no CPU kernels, or the reason above). ggml_int8_activations: how its GGML GEMVs
    multiply (the engine's EngineArgs.ggml_bf16_activations, negated)."""
    if kernels is None or fused_decoder_unsupported_reason(model) is not None:
        return None
    try:
        decoder = binder_for(model).bind(model, kernels, block_size, max_positions)
    except (ValueError, RuntimeError) as e:  # a shape the kernel does not take: the torch path still runs it
        print(f"tacit: fused decode step unavailable for this model ({e}); using the torch path", file=sys.stderr)
        return None
    decoder.set_ggml_int8_activations(ggml_int8_activations)
    return decoder
