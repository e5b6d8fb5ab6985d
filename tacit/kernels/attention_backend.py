"""AttentionBackend: causal attention for a flat mixed batch over a paged KV cache.

A backend owns four things: the spec of the cache each layer needs under it (its kind, dtype,
bytes a token, shape: tacit/kv_cache_interface.py; the pool is sized and allocated from these),
the per-step metadata it needs (built once per step from plain numpy arrays, never from Request
objects), how a step's keys and values land in the cache, and the attention itself. Backends register by name; the model runner picks one per model
(tacit/layers/attention_selector.py) and binds it to every KV-cache layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from tacit.kv_cache_interface import FullAttentionSpec, KVCacheSpec, MLAAttentionSpec, SlidingWindowSpec
from tacit.registry import Registry


@dataclass
class AttentionMetadata:
    """What every backend's metadata carries; each backend subclasses it with its own layout."""

    slot_mapping: torch.Tensor  # [T] cache slot each new token writes
    num_tokens: int


class AttentionBackend(ABC):
    name: ClassVar[str]
    # Multi-head latent attention (DeepSeek's MLA) caches one compressed latent per token and
    # needs the layer's up-projection; a layer only takes a backend of its own kind.
    use_mla: ClassVar[bool] = False
    # Among backends that support a platform and dtype, the lowest priority is chosen.
    priority: ClassVar[int]

    @classmethod
    @abstractmethod
    def supports(cls, platform: str, dtype: torch.dtype) -> bool:
        """Whether this backend runs on `platform` ("cpu", "cuda") with a model in `dtype`."""

    def get_kv_cache_spec(self, layer: Any, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """The cache `layer` needs under this backend, in `dtype` (the parsed --kv-cache-dtype):
        a key and a value row for each of its num_kv_heads heads of head_dim; a layer with a
        sliding window keeps only the window's tokens (SlidingWindowSpec)."""
        window = getattr(layer, "sliding_window", None)
        if window is not None:
            return SlidingWindowSpec(
                block_size=block_size,
                dtype=dtype,
                num_kv_heads=layer.num_kv_heads,
                head_size=layer.head_dim,
                sliding_window=window,
            )
        return FullAttentionSpec(
            block_size=block_size, dtype=dtype, num_kv_heads=layer.num_kv_heads, head_size=layer.head_dim
        )

    @abstractmethod
    def build_metadata(
        self,
        num_new_tokens: np.ndarray,
        num_computed_tokens: np.ndarray,
        block_tables: np.ndarray,
        slot_mapping: np.ndarray,
        device: torch.device,
        block_size: int,
    ) -> AttentionMetadata:
        """One step's metadata. Per request r (in the flat batch's order): num_new_tokens[r] tokens
        at positions num_computed_tokens[r]...; block_tables [R, B] its cache blocks (padded);
        slot_mapping [T] the cache slot of each new token."""

    @abstractmethod
    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store this step's key/value ([T, Hkv, D]) at meta.slot_mapping in kv_cache [2, blocks, block_size, Hkv, D]."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        *,
        sliding_window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, H, D] -> output [T, H, Dv], each token attending to its request's context:
        with sliding_window W only to its last W positions (itself included, transformers'
        meaning); with sinks [H] a learned per-head logit joins each softmax (gpt-oss)."""


class MLAAttentionBackend(AttentionBackend):
    """Multi-head latent attention: the cache holds [kv_lora_rank + rope_dim] per token (the
    normed latent, then the rotated shared key part), K and V come from the latent through the
    layer's kv_b_proj weight [H * (nope_dim + v_dim), kv_lora_rank]."""

    use_mla = True

    def get_kv_cache_spec(self, layer: Any, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """One row per token of the layer's kv_lora_rank latent and its rope_dim rotated key part."""
        return MLAAttentionSpec(
            block_size=block_size, dtype=dtype, kv_lora_rank=layer.kv_lora_rank, rope_dim=layer.rope_dim
        )

    @abstractmethod
    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata) -> None:
        """key: the normed latent [T, kv_lora_rank]; value: the rotated k_pe [T, rope_dim];
        both land side by side at meta.slot_mapping in kv_cache [blocks, block_size, kv_lora_rank + rope_dim]."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        *,
        kv_b_proj: torch.Tensor,
    ) -> torch.Tensor:
        """query [T, H, nope_dim + rope_dim] -> [T, H, v_dim], through the layer's up-projection weight kv_b_proj."""


ATTENTION_BACKENDS = Registry("attention_backend")
register_attention_backend = ATTENTION_BACKENDS.register


def registered_attention_backends() -> dict[str, type[AttentionBackend]]:
    """Every backend whose module has been imported (tacit/layers/attention_selector.py imports them all)."""
    return dict(ATTENTION_BACKENDS)
