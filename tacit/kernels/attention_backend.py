"""AttentionBackend: causal attention for a flat mixed batch over a paged KV cache."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from tacit.forward_context import AttentionMetadata


class AttentionBackend(ABC):
    @abstractmethod
    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store this step's key/value ([T, Hkv, D]) at meta.slot_mapping in kv_cache [2, blocks, block_size, Hkv, D]."""

    @abstractmethod
    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """query [T, H, D] -> output [T, H, Dv], each token attending to its request's context."""
