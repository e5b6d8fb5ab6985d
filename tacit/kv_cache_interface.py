"""KV cache specs and the KV cache configuration, in vLLM v1's words (vllm/v1/kv_cache_interface.py).

Each attention backend declares, per layer, the spec of the cache that layer needs
(AttentionBackend.get_kv_cache_spec): its kind, the cache tensor's dtype (and so whether it
holds int8 rows with a scale each, kernels/kv_quant.py), the block size, the bytes one token
takes and the tensor's shape. The worker groups the layers of equal specs
(memory/kv_cache_utils.py), sizes one pool for all of them once, allocates every layer's cache
from its spec and answers the engine with a KVCacheConfig: plain data, the same whatever the
rank layout, from which the engine builds its KVCacheManager, its SwapSpace and its capped
max_model_len without reading the runner.

The kinds that exist keep every token's KV (full attention; MLA's latent; MLA's latent with
DeepSeek-V3.2's indexer key), so block id b addresses block b of every layer's cache and one
block table per request serves every group.
Kinds that drop tokens (sliding windows, a sparse-attention index cache, sinks) need a table of
their own per group; they come with the issue that adds them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from tacit.kernels.kv_quant import KV_CACHE_DTYPES, kv_row_width, paged_int8_shape

# The tensor dtypes a KV cache may have: what parse_kv_cache_dtype can answer.
_CACHE_DTYPES = tuple(getattr(torch, name) for name in KV_CACHE_DTYPES if name != "auto")


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec(ABC):
    """One layer's cache: what the pool's size and the layer's tensor are computed from."""

    block_size: int  # tokens a block holds
    dtype: torch.dtype  # the cache tensor's dtype (the model's, or --kv-cache-dtype)
    kind: ClassVar[str]

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(
                f"{type(self).__name__}: block_size={self.block_size!r} is invalid: must be an integer >= 1"
            )
        if self.dtype not in _CACHE_DTYPES:
            valid = ", ".join(str(d) for d in _CACHE_DTYPES)
            raise ValueError(f"{type(self).__name__}: dtype={self.dtype} is not a KV cache dtype; valid: {valid}")

    @property
    def quantized(self) -> bool:
        """int8 rows, each followed by its fp32 scale (kernels/kv_quant.py): the one quantized
        cache dtype there is."""
        return self.dtype == torch.int8

    @property
    @abstractmethod
    def numel_per_token(self) -> int:
        """Cache elements one token takes (int8: the values and each row's scale bytes)."""

    @abstractmethod
    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """The shape of a cache of num_blocks blocks."""

    @property
    def bytes_per_token(self) -> int:
        return self.numel_per_token * self.dtype.itemsize

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer's cache."""
        return self.block_size * self.bytes_per_token


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(KVCacheSpec):
    """A key and a value row per kv head per token: [2, num_blocks, block_size, Hkv, D], or in
    int8 [2, num_blocks, Hkv, block_size * (D + 4)] (kernels/kv_quant.py's paged layout)."""

    num_kv_heads: int
    head_size: int
    kind: ClassVar[str] = "full_attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_kv_heads < 1 or self.head_size < 1:
            raise ValueError(
                f"FullAttentionSpec: num_kv_heads={self.num_kv_heads} and head_size={self.head_size} must be >= 1"
            )

    @property
    def numel_per_token(self) -> int:
        return 2 * self.num_kv_heads * kv_row_width(self.head_size, self.dtype)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        if self.quantized:
            return paged_int8_shape(num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        return (2, num_blocks, self.block_size, self.num_kv_heads, self.head_size)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(KVCacheSpec):
    """DeepSeek's multi-head latent attention: one row per token, shared by every head, of the
    normed latent then the rotated key part: [num_blocks, block_size, kv_lora_rank + rope_dim];
    in int8 each of the two is its own row with its scale (a scale across both would cost the
    normed latent its resolution to k_pe, which is not normed)."""

    kv_lora_rank: int
    rope_dim: int
    kind: ClassVar[str] = "mla"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_lora_rank < 1 or self.rope_dim < 1:
            raise ValueError(
                f"MLAAttentionSpec: kv_lora_rank={self.kv_lora_rank} and rope_dim={self.rope_dim} must be >= 1"
            )

    @property
    def numel_per_token(self) -> int:
        return kv_row_width(self.kv_lora_rank, self.dtype) + kv_row_width(self.rope_dim, self.dtype)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (num_blocks, self.block_size, self.numel_per_token)


@dataclass(frozen=True, kw_only=True)
class MLAIndexerAttentionSpec(MLAAttentionSpec):
    """DeepSeek-V3.2's sparse attention (DSA): MLA's latent row plus the lightning indexer's key
    (index_head_dim values, one per token shared by every index head) in one spec, so the pool,
    swap, preemption and the prefix cache carry the indexer's keys with the latents, block for
    block, with no other change: the indexer scores every earlier token, so it keeps every
    token's key as MLA keeps every latent (nothing is dropped, one block table still serves).

    Block-major: a block is its block_size latent rows, then its block_size index rows
    ([num_blocks, block_size * row]; kernels/sparse_mla_attention.py dsa_cache_views). Each half
    is then a [blocks, block_size, width] view whose block_size x width run is contiguous, so
    the indexer reads a block's keys (16 x 256 bytes in V3.2's bf16) as one run instead of
    256-byte pieces at a 1,408-byte stride. int8: the index key is one more kv_quant row with
    its scale.

    Bytes per token for V3.2's dims (kv_lora_rank 512, rope 64, index_head_dim 128): bf16
    (512 + 64) x 2 = 1,152 for the latent, + 128 x 2 = 256 for the index key: 1,408 (+22%);
    int8 (512 + 4) + (64 + 4) + (128 + 4) = 716. (DeepSeek's own FP8 layout is 656 bytes of
    latent and rope, + 132 for the FP8 index key with its scale.)"""

    index_head_dim: int
    kind: ClassVar[str] = "mla_indexer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.index_head_dim < 1:
            raise ValueError(f"MLAIndexerAttentionSpec: index_head_dim={self.index_head_dim} must be >= 1")

    @property
    def latent_numel_per_token(self) -> int:
        """The MLA half of a token's elements (the latent row, then k_pe's)."""
        return super().numel_per_token

    @property
    def index_numel_per_token(self) -> int:
        return kv_row_width(self.index_head_dim, self.dtype)

    @property
    def numel_per_token(self) -> int:
        return self.latent_numel_per_token + self.index_numel_per_token

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (num_blocks, self.block_size * self.numel_per_token)


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers whose caches share one spec (named as model.named_modules() names them)."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec


def bytes_per_block_of(groups: tuple[KVCacheGroupSpec, ...]) -> int:
    """Bytes one block id takes across every layer of the groups: what the pool is sized by."""
    return sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups)


@dataclass(frozen=True)
class KVCacheConfig:
    """What the worker answers the engine once the pool is allocated; the same on every rank of
    a layout (MultiProcExecutor checks that they agree)."""

    num_blocks: int  # per pool
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    # The max_model_len the engine runs with: the model's, capped at what one pool holds when the
    # user did not set it (config/engine_config.py fit_kv_capacity).
    max_model_len: int
    # One pool per data-parallel attention rank (each holds only its own requests' KV), else 1.
    num_pools: int = 1
    # Bytes a second, from one timed copy of a few blocks to host memory (the swap cost model's
    # first bandwidth, memory/swap.py); None when swapping is off. A measurement, not part of
    # what the pool is: left out of equality, so two ranks' configs compare equal.
    swap_bytes_per_s: float | None = field(default=None, compare=False)
    # The block hashes the prefix cache's second tier holds at start (a disk tier's valid files,
    # least recently written first; the same on every rank, worker/rank.py). Left out of
    # equality for the same reason.
    offloaded_block_hashes: tuple[bytes, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.kv_cache_groups:
            raise ValueError("KVCacheConfig: no KV cache groups (the model declared no KV cache layers)")
        sizes = sorted({g.kv_cache_spec.block_size for g in self.kv_cache_groups})
        if len(sizes) > 1:
            # One block table serves every group (module docstring): block b of every layer
            # holds the same tokens only if every layer's blocks hold the same number.
            raise ValueError(f"KVCacheConfig: groups of different block sizes {sizes}; one block table needs one")
        if self.num_blocks < 1 or self.num_pools < 1:
            raise ValueError(f"KVCacheConfig: num_blocks={self.num_blocks} and num_pools={self.num_pools} must be >= 1")

    @property
    def block_size(self) -> int:
        return self.kv_cache_groups[0].kv_cache_spec.block_size

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id takes across every layer of this rank (what a swap copies)."""
        return bytes_per_block_of(self.kv_cache_groups)

    @property
    def capacity_tokens(self) -> int:
        """Tokens one pool holds (a request lives in one pool)."""
        return self.num_blocks * self.block_size
