"""KVCacheLayer: what a layer declares to own a slice of the paged KV cache.

The model runner sizes the pool from kv_numel_per_token, binds each layer's cache with
allocate_kv_cache and its attention backend with set_attention_backend; a runner's KVSwapStore copies
blocks along kv_block_dim. Layers are found by this interface, never by attribute names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from tacit.kernels.attention_backend import AttentionBackend


class KVCacheLayer(ABC):
    # MLA layers cache a compressed latent and need an MLA backend; the rest a paged one.
    use_mla: ClassVar[bool] = False
    kv_cache: torch.Tensor | None
    backend: AttentionBackend | None

    @property
    @abstractmethod
    def kv_block_dim(self) -> int:
        """The axis of kv_cache that indexes blocks (the next one indexes slots in a block)."""

    @abstractmethod
    def kv_numel_per_token(self, dtype: torch.dtype) -> int:
        """Cache elements one token takes in this layer in a cache of `dtype` (int8: the values
        and each row's scale, kernels/kv_quant.py)."""

    @abstractmethod
    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Bind a zeroed cache of num_blocks blocks of block_size tokens to self.kv_cache."""

    def set_attention_backend(self, backend: AttentionBackend) -> None:
        if backend.use_mla != self.use_mla:
            want = "an MLA" if self.use_mla else "a paged (non-MLA)"
            raise ValueError(f"{type(self).__name__} needs {want} attention backend, got {backend.name!r}")
        self.backend = backend
