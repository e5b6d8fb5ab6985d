"""The KV pool, decided once at load: each layer's spec from its backend, the layers grouped by
spec, the pool's size (an explicit block count, a memory budget, or the default budget, refused
before anything is allocated when the host cannot hold it), then every layer's cache allocated
from its spec."""

from __future__ import annotations

import torch

from tacit.config import EngineConfig
from tacit.kv_cache_interface import (
    KVCacheGroupSpec,
    KVCacheSpec,
    blocks_for_tokens,
    is_hybrid,
    sliding_windows_of,
    table_of_group,
)
from tacit.layers.kv_cache import KVCacheLayer
from tacit.memory.kv_cache_utils import get_kv_cache_groups

DEFAULT_KV_BUDGET = 2 << 30  # 2 GiB, capped by what the batch limits could ever use


def num_kv_blocks(
    config: EngineConfig, bytes_per_block: int, groups: tuple[KVCacheGroupSpec, ...], free_memory: int
) -> int:
    """How many KV blocks of bytes_per_block this rank's pool holds."""
    cache = config.cache
    fits = free_memory // bytes_per_block
    if cache.num_kv_blocks is not None:
        if cache.num_kv_blocks > fits:  # refused here, not by the allocator's out-of-memory error
            raise ValueError(
                f"num_kv_blocks={cache.num_kv_blocks} needs {cache.num_kv_blocks * bytes_per_block} bytes of "
                f"KV cache ({bytes_per_block} a block); {free_memory} bytes are free, room for at most {fits}"
            )
        return cache.num_kv_blocks
    if cache.kv_cache_memory is not None and cache.kv_cache_memory > free_memory:
        raise ValueError(f"kv_cache_memory={cache.kv_cache_memory} bytes is more than the {free_memory} bytes free")
    budget = cache.kv_cache_memory or min(DEFAULT_KV_BUDGET, free_memory // 2)
    num = budget // bytes_per_block
    # No point holding more than max_num_seqs full-length sequences.
    chunk = config.scheduler.max_num_batched_tokens
    windows, bs = sliding_windows_of(groups), groups[0].kv_cache_spec.block_size
    most = blocks_for_tokens(windows, bs, config.model.max_model_len, chunk) * config.scheduler.max_num_seqs
    num = min(num, most)
    if num < 1:
        raise ValueError(f"kv_cache_memory={budget} bytes is below one KV block ({bytes_per_block} bytes)")
    return int(num)


def kv_cache_groups(
    layers: dict[str, KVCacheLayer], block_size: int, dtype: torch.dtype
) -> tuple[KVCacheGroupSpec, ...]:
    """{layer name: layer} (backends bound) -> the layers grouped by the spec their backend declares."""
    specs: dict[str, KVCacheSpec] = {name: m.get_kv_cache_spec(block_size, dtype) for name, m in layers.items()}
    return get_kv_cache_groups(specs)


def allocate_kv_caches(
    layers: dict[str, KVCacheLayer], groups: tuple[KVCacheGroupSpec, ...], num_blocks: int, device: torch.device
) -> None:
    """Allocate each layer's cache of num_blocks blocks from its group's spec and bind the spec
    (and the block table it reads) to it. A hybrid model's groups share tensors: layer j of
    every group binds the tensor layer j of the first group allocated (the groups' pages are of
    one shape, checked when grouped); otherwise each layer has its own. A layer whose tensor is not what its spec says (a layer
    computing its own shape, as DeepSeek's MLAAttention does) is refused here: the pool was
    sized from the specs."""
    shared: list[torch.Tensor] = []
    hybrid = is_hybrid(groups)
    for index, group in enumerate(groups):
        spec = group.kv_cache_spec
        for j, name in enumerate(group.layer_names):
            m = layers[name]
            m.kv_cache_group = table_of_group(groups, index)
            if hybrid and j < len(shared):
                m.kv_cache, m.kv_cache_spec = shared[j], spec
                continue
            m.allocate_kv_cache(num_blocks, spec.block_size, spec.dtype, device)
            shared.append(m.kv_cache)
            want = spec.kv_cache_shape(num_blocks)
            if m.kv_cache is None or tuple(m.kv_cache.shape) != want or m.kv_cache.dtype != spec.dtype:
                got = None if m.kv_cache is None else (tuple(m.kv_cache.shape), m.kv_cache.dtype)
                raise RuntimeError(
                    f"layer {name} ({type(m).__name__}) allocated a KV cache {got}; its {spec.kind} spec "
                    f"says {(want, spec.dtype)}"
                )
            m.kv_cache_spec = spec
