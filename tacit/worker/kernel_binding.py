"""The kernels a model runs on, chosen once at load: how its linear layers multiply, which
kernel runs its experts, which backend attends (bound to every layer that owns KV cache). The
model runner binds its model so; a proposer that runs layers of its own (MTP) binds them alike."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.layers.attention_selector import select_attention_backend
from tacit.layers.kv_cache import KVCacheLayer
from tacit.layers.linear import select_linear_method, use_linear_method
from tacit.layers.moe import select_moe_kernel, use_moe_kernel


def kv_cache_layers(model: nn.Module) -> dict[str, KVCacheLayer]:
    """{module name: layer} of every layer that owns a slice of the KV cache, in model order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, KVCacheLayer)}


def load_kernels(cfg: ModelConfig, device: torch.device) -> Any:
    """The CPU kernels (csrc/) where this model runs them (bf16 on the CPU), else None."""
    if device.type == "cpu" and cfg.dtype == torch.bfloat16:
        from tacit.kernels.cpu_kernels import load_cpu_kernels

        return load_cpu_kernels(cfg.cpu_kernels)
    return None


def bind_compute_kernels(model: nn.Module, cfg: ModelConfig, device: torch.device) -> None:
    """How model's linear layers multiply and which kernel runs its experts."""
    int8_activations = not cfg.ggml_bf16_activations
    use_linear_method(model, select_linear_method(device.type, cfg.dtype, cfg.cpu_kernels))
    use_moe_kernel(model, select_moe_kernel(device.type, cfg.dtype, cfg.cpu_kernels, int8_activations))


def bind_attention_backend(
    model: nn.Module, cfg: ModelConfig, device: torch.device
) -> tuple[Any, dict[str, KVCacheLayer]]:
    """The attention backend, bound to each of model's KV cache layers: (backend, those layers)."""
    backend = select_attention_backend(device.type, cfg.dtype, cfg)
    layers = kv_cache_layers(model)
    for m in layers.values():
        m.set_attention_backend(backend)
    return backend, layers
