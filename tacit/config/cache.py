"""CacheConfig: the KV pool's blocks, its size, what it stores, and the swap space behind it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tacit.kernels.kv_quant import parse_kv_cache_dtype


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None
    # Bytes for the KV pool when num_kv_blocks is not given.
    kv_cache_memory: int | None = None
    # Host memory (GiB) that preempted requests' KV blocks may be swapped to; vLLM's name and
    # default. 4 GiB holds ~180k tokens of SmolLM2-135M's bf16 KV (23 KB a token).
    swap_space: float = 4.0
    # What the KV cache stores: "auto" the model's dtype, or int8 rows with a scale each
    # (kernels/kv_quant.py): half of bf16's bytes, so twice the tokens in the same pool.
    cache_dtype: str = "auto"
    # The prefix cache (vLLM's name; on by default, as there): full blocks of verified tokens
    # shared between requests by a hash chain, so a hit skips their prefill.
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        parse_kv_cache_dtype(self.cache_dtype, torch.float32)  # refuses an unknown one, naming the valid
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size!r} is invalid: must be an integer >= 1")
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1):
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks!r} is invalid: must be an integer >= 1")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory!r} is invalid: must be a byte count > 0")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching={self.enable_prefix_caching!r} is invalid: must be true or false")
        if not isinstance(self.swap_space, (int, float)) or self.swap_space < 0:
            raise ValueError(f"swap_space={self.swap_space!r} is invalid: must be GiB >= 0 (0 turns swapping off)")
