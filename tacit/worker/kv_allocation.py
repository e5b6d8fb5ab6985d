"""The KV pool's size, decided once at load: an explicit block count, a memory budget, or the
default budget, refused before anything is allocated when the host cannot hold it."""

from __future__ import annotations

from tacit.config import EngineConfig

DEFAULT_KV_BUDGET = 2 << 30  # 2 GiB, capped by what the batch limits could ever use


def num_kv_blocks(config: EngineConfig, bytes_per_block: int, block_size: int, free_memory: int) -> int:
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
    most = -(-config.model.max_model_len // block_size) * config.scheduler.max_num_seqs
    num = min(num, most)
    if num < 1:
        raise ValueError(f"kv_cache_memory={budget} bytes is below one KV block ({bytes_per_block} bytes)")
    return int(num)
