"""KVCacheLayer: what a layer declares to own a slice of the paged KV cache.

The model runner binds each layer's attention backend (set_attention_backend), asks it for the
spec of the layer's cache (get_kv_cache_spec: the backend declares it, tacit/kv_cache_interface.py),
sizes the pool from the specs, and binds each layer's cache (allocate_kv_cache) and the spec it
was allocated with (kv_cache_spec, what code that reads the cache asks: its dtype, whether it is
quantized, its bytes a token). A runner's KVSwapStore copies blocks along kv_block_dim. Layers
are found by this interface, never by attribute names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from tacit.kernels.attention_backend import AttentionBackend
from tacit.kv_cache_interface import KVCacheSpec


class KVCacheLayer(ABC):
    # MLA layers cache a compressed latent and need an MLA backend; the rest a paged one.
    use_mla: ClassVar[bool] = False
    kv_cache: torch.Tensor | None
    backend: AttentionBackend | None
    # Bound by the model runner with the cache (None before): the spec kv_cache was allocated from.
    kv_cache_spec: KVCacheSpec | None = None
    # The KV cache group the layer is in: which of the step's block tables (and so which
    # attention metadata) it reads; 0 unless layers of several kinds share the pool.
    kv_cache_group: int = 0

    @property
    @abstractmethod
    def kv_block_dim(self) -> int:
        """The axis of kv_cache that indexes blocks (the next one indexes slots in a block)."""

    @abstractmethod
    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Bind a zeroed cache of num_blocks blocks of block_size tokens to self.kv_cache, of the
        shape get_kv_cache_spec(block_size, dtype) declares."""

    def set_attention_backend(self, backend: AttentionBackend) -> None:
        if backend.use_mla != self.use_mla:
            want = "an MLA" if self.use_mla else "a paged (non-MLA)"
            raise ValueError(f"{type(self).__name__} needs {want} attention backend, got {backend.name!r}")
        self.backend = backend

    def get_kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """The spec of this layer's cache in `dtype`, as its backend declares it."""
        if getattr(self, "backend", None) is None:
            raise RuntimeError(f"{type(self).__name__} has no attention backend bound: its cache spec is the backend's")
        return self.backend.get_kv_cache_spec(self, block_size, dtype)
