"""KV cache specs and the KV cache configuration, in vLLM v1's words (vllm/v1/kv_cache_interface.py).

Each attention backend declares, per layer, the spec of the cache that layer needs
(AttentionBackend.get_kv_cache_spec): its kind, the cache tensor's dtype (and so whether it
holds int8 rows with a scale each, kernels/kv_quant.py), the block size, the bytes one token
takes and the tensor's shape. The worker groups the layers of equal specs
(memory/kv_cache_utils.py), sizes one pool for all of them once, allocates every layer's cache
from its spec and answers the engine with a KVCacheConfig: plain data, the same whatever the
rank layout, from which the engine builds its KVCacheManager, its SwapSpace and its capped
max_model_len without reading the runner.

Groups whose kinds all keep every token (full attention, MLA's latent, MLA with DSA's index
keys, in any mix: GLM-5's layers with and without an indexer) share one block table: block id b
addresses block b of every layer's own tensor. With a sliding window among them (gpt-oss,
Gemma 3: a hybrid model) the layers form groups of equal size that share the cache tensors
instead (vLLM's hybrid allocator): tensor j holds layer j of every group, a block id belongs to
one group at a time, and each request keeps one block table per group. A full-attention
group's table grows with the context; a sliding-window group's gives back the blocks behind the
window, so its share is bounded by the window.
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
class SlidingWindowSpec(FullAttentionSpec):
    """Full attention's rows, for a layer that attends only to each query's last sliding_window
    positions (gpt-oss: 128; Gemma 3: 512 or 1024): a request needs only the blocks the window
    reaches, so the blocks behind it can be given back as it decodes."""

    sliding_window: int
    kind: ClassVar[str] = "sliding_window"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.sliding_window, int) or self.sliding_window < 1:
            raise ValueError(f"SlidingWindowSpec: sliding_window={self.sliding_window!r} must be an integer >= 1")


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


def is_hybrid(groups: tuple[KVCacheGroupSpec, ...]) -> bool:
    """Whether some group has a sliding window: then each group keeps its own block table and
    the groups share cache tensors (module docstring); else one table serves them all."""
    return any(window_of(g.kv_cache_spec) is not None for g in groups)


def bytes_per_block_of(groups: tuple[KVCacheGroupSpec, ...]) -> int:
    """Bytes one block id takes: what the pool is sized by. One table: a page of every layer;
    hybrid: a page of each shared tensor, one per layer of the largest group."""
    pages = [g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups]
    return max(pages) if is_hybrid(groups) else sum(pages)


def window_of(spec: KVCacheSpec) -> int | None:
    """The sliding window of a group's layers; None for a kind that keeps every token."""
    return getattr(spec, "sliding_window", None)


def sliding_peak_blocks(window: int, block_size: int, chunk_tokens: int) -> int:
    """The most blocks a sliding group of `window` holds for one request while it computes a
    chunk of chunk_tokens tokens: the window - 1 positions before the chunk's first query and
    the chunk's own (its early tokens' keys are read by its later ones until the step ends),
    L consecutive positions, which straddle at most (L + block_size - 2) // block_size + 1
    blocks at the worst alignment."""
    span = window - 1 + chunk_tokens
    return (span + block_size - 2) // block_size + 1


def blocks_for_tokens(windows: tuple[int | None, ...], block_size: int, num_tokens: int, chunk_tokens: int) -> int:
    """Block ids a request of num_tokens tokens holds at most across groups of these windows
    (None: full attention), computed in chunks of at most chunk_tokens: every block of its
    context in a full group, at most a window and a chunk's worth in a sliding one."""
    per_table = -(-num_tokens // block_size)
    return sum(
        per_table if w is None else min(per_table, sliding_peak_blocks(w, block_size, chunk_tokens)) for w in windows
    )


def capacity_tokens_of(windows: tuple[int | None, ...], block_size: int, num_blocks: int, chunk_tokens: int) -> int:
    """The most tokens one request can hold in a pool of num_blocks, computed in chunks of at
    most chunk_tokens: what the full groups' tables leave after the sliding groups' peaks.
    Sliding groups alone bound nothing (then the pool's tokens are the answer)."""
    full = sum(w is None for w in windows)
    if not full:
        return num_blocks * block_size
    peaks = sum(sliding_peak_blocks(w, block_size, chunk_tokens) for w in windows if w is not None)
    return max(num_blocks - peaks, 0) // full * block_size


def sliding_windows_of(groups: tuple[KVCacheGroupSpec, ...]) -> tuple[int | None, ...]:
    """Each block table's window (None: full): one per group of a hybrid model, in group order;
    (None,) for groups that share one table."""
    return tuple(window_of(g.kv_cache_spec) for g in groups) if is_hybrid(groups) else (None,)


def table_of_group(groups: tuple[KVCacheGroupSpec, ...], group: int) -> int:
    """The block table (and so the attention metadata) a group's layers read."""
    return group if is_hybrid(groups) else 0


def check_shareable(groups: tuple[KVCacheGroupSpec, ...]) -> None:
    """A hybrid model's groups share cache tensors, so they need pages of one shape (the same
    rows a token, the same block size): a sliding layer beside a full one of the same heads
    passes; a sliding layer beside MLA's latent would not. Groups of one table need only one
    block size."""
    sizes = sorted({g.kv_cache_spec.block_size for g in groups})
    if len(sizes) > 1:
        raise ValueError(f"KVCacheConfig: groups of different block sizes {sizes}; a block table needs one")
    shapes = {g.kv_cache_spec.kv_cache_shape(1) for g in groups}
    dtypes = {g.kv_cache_spec.dtype for g in groups}
    if is_hybrid(groups) and len(groups) > 1 and (len(shapes) > 1 or len(dtypes) > 1):
        kinds = ", ".join(f"{g.kv_cache_spec.kind} {g.kv_cache_spec.kv_cache_shape(1)}" for g in groups)
        raise ValueError(f"KV cache groups cannot share cache tensors: their pages differ ({kinds})")


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
    # The most tokens a step computes for one request (max_num_batched_tokens): a sliding
    # group holds its window plus that many while the step runs (sliding_peak_blocks).
    max_chunk_tokens: int = 0
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
        check_shareable(self.kv_cache_groups)
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
        """Tokens one request can hold in one pool (a request lives in one pool)."""
        return capacity_tokens_of(self.sliding_windows, self.block_size, self.num_blocks, self.max_chunk_tokens)

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """Each group's window (None: full), in group order: what the KV manager frees by."""
        return sliding_windows_of(self.kv_cache_groups)
