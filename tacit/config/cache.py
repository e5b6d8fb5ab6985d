"""CacheConfig: the KV pool's blocks, its size, what it stores, and the swap space behind it."""

from __future__ import annotations

import math
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
    # The prefix cache's second tier (memory/kv_offload.py): GiB that blocks evicted from the
    # pool move to (vLLM's --kv-offloading-size), 0 for none; in files under kv_offloading_dir
    # (kept across restarts) when it is set, else in host memory.
    kv_offloading_size: float = 0.0
    kv_offloading_dir: str | None = None

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
        size = self.kv_offloading_size
        if not isinstance(size, (int, float)) or not math.isfinite(size) or size < 0:
            raise ValueError(f"kv_offloading_size={size!r} is invalid: must be GiB >= 0 (0: no second tier)")
        if size and not self.enable_prefix_caching:
            raise ValueError("kv_offloading_size > 0 needs the prefix cache: it holds the blocks the cache evicts")
        if self.kv_offloading_dir is not None and not size:
            raise ValueError(
                f"kv_offloading_dir={self.kv_offloading_dir!r} needs kv_offloading_size > 0: the GiB the tier may hold"
            )
        if not isinstance(self.swap_space, (int, float)) or self.swap_space < 0:
            raise ValueError(f"swap_space={self.swap_space!r} is invalid: must be GiB >= 0 (0 turns swapping off)")
