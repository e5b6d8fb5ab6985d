"""Attention backends by name, and the one a model runs with (chosen once, by the model runner).

Importing this module imports every backend, so each has registered itself by the time a
name is looked up.
"""

from __future__ import annotations

import torch

import tacit.kernels.absorbed_mla_attention  # noqa: F401  registers "absorbed_mla"
import tacit.kernels.torch_attention  # noqa: F401  registers "torch_paged"
import tacit.kernels.torch_mla_attention  # noqa: F401  registers "torch_mla"
from tacit.config import ModelConfig
from tacit.kernels.attention_backend import ATTENTION_BACKENDS, AttentionBackend, registered_attention_backends


def get_attention_backend(name: str) -> AttentionBackend:
    return ATTENTION_BACKENDS.lookup(name)()


def uses_mla(model_config: ModelConfig) -> bool:
    """DeepSeek-V2/V3-style models cache a compressed latent (their config has kv_lora_rank)."""
    return model_config.hf.get("kv_lora_rank") is not None


def select_attention_backend(platform: str, dtype: torch.dtype, model_config: ModelConfig) -> AttentionBackend:
    """The lowest-priority registered backend of the model's kind (MLA or not) that supports
    `platform` ("cpu", "cuda") and `dtype`."""
    mla = uses_mla(model_config)
    fits = [
        cls for cls in registered_attention_backends().values() if cls.use_mla == mla and cls.supports(platform, dtype)
    ]
    if not fits:
        kind = "MLA" if mla else "paged"
        raise ValueError(f"no {kind} attention backend supports platform={platform!r} with dtype={dtype}")
    return min(fits, key=lambda cls: cls.priority)()
