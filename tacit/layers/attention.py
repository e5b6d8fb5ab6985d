"""Attention layer: owns its slice of the KV cache and hands the math to an AttentionBackend."""

from __future__ import annotations

import torch
from torch import nn

from tacit.forward_context import get_attention_metadata
from tacit.kernels.attention_backend import AttentionBackend
from tacit.layers.kv_cache import KVCacheLayer


class Attention(nn.Module, KVCacheLayer):
    kv_block_dim = 1  # [2, num_blocks, block_size, Hkv, D]; int8: [2, num_blocks, Hkv, block_size * (D + 4)]

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int,
        scale: float,
        *,
        sliding_window: int | None = None,
        sinks: bool = False,
    ) -> None:
        """sliding_window: attend to each query's last W positions only (None: all of them).
        sinks: a learned logit per head (the checkpoint's `sinks` [num_heads], this rank's
        heads under tensor parallelism) that joins each softmax, as gpt-oss's attention does."""
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads, self.scale = num_heads, head_dim, num_kv_heads, scale
        if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
            raise ValueError(f"sliding_window={sliding_window!r} must be an integer >= 1 or None")
        self.sliding_window = sliding_window
        self.sinks = nn.Parameter(torch.zeros(num_heads), requires_grad=False) if sinks else None
        # Both bound by the model runner: the backend it selected for the model
        # (layers/attention_selector.py), and the cache once it has sized the pool.
        self.backend: AttentionBackend | None = None
        self.kv_cache: torch.Tensor | None = None

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        # The shape is the spec's (int8: kernels/kv_quant.py's paged layout). Zeroed, not empty:
        # masked-out slots still pass through softmax(...) @ V, and NaN * 0 is NaN.
        shape = self.get_kv_cache_spec(block_size, dtype).kv_cache_shape(num_blocks)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H*D]."""
        meta = get_attention_metadata(self.kv_cache_group)
        assert self.kv_cache is not None, "KV cache not bound; the model runner binds it at start-up"
        self.backend.write_kv(self.kv_cache, k, v, meta)
        out = self.backend.forward(
            q, self.kv_cache, meta, self.scale, sliding_window=self.sliding_window, sinks=self.sinks
        )
        return out.reshape(out.shape[0], -1)
