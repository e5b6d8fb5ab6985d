"""`tacit bench attention --sliding-window`: a sliding-window layer against a full layer of the
same shape, one decode row at a given context, through the torch paged backend those models
run on, and the KV bytes a request of that context holds in each case.

A full layer reads every cached position each decode step (32k positions of gpt-oss-20b's 8
kv heads x 64 in bf16: 64 MB a layer); a window of 128 reads 128 (plus up to a block more, the
window gathered as whole blocks): the time should fall with the bytes read. The KV bytes per
request are what the pool's KV manager holds for a request decoding at that context: a sliding
group its window's blocks, a full one the whole context. (While a prompt prefills, a sliding group also holds the
step's chunk: max_num_batched_tokens more, given back as the window moves on.)
"""

from __future__ import annotations

import time

import numpy as np
import torch

from tacit.config.model import layer_sliding_windows
from tacit.kernels.torch_attention import TorchAttentionBackend
from tacit.kv_cache_interface import FullAttentionSpec, bytes_per_block_of, sliding_windows_of
from tacit.memory.kv_cache_utils import window_groups
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager


def measure_sliding_window(hf: dict, context: int, repeats: int, block_size: int = 16) -> list[dict]:
    """Rows of {layer, context, ms_per_layer, kv_mb_per_request, ...} for a full and a sliding
    layer of hf's attention shape at `context`, alternated within each repeat."""
    windows = layer_sliding_windows(hf)
    sliding = sorted({w for w in windows if w is not None})
    if not sliding:
        raise ValueError("the model has no sliding-window layers (config layer_types / sliding_window)")
    window = sliding[0]
    heads = int(hf["num_attention_heads"])
    hkv = int(hf.get("num_key_value_heads") or heads)
    d = int(hf.get("head_dim") or hf["hidden_size"] // heads)
    blocks = -(-context // block_size)
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, blocks, block_size, hkv, d, generator=g).bfloat16()
    q = torch.randn(1, heads, d, generator=g).bfloat16()
    backend = TorchAttentionBackend()
    tables = np.arange(blocks, dtype=np.int64)[None, :]
    computed = np.array([context - 1], dtype=np.int64)
    slot = np.array([context - 1], dtype=np.int64)

    def step(w: int | None) -> float:
        # The metadata is built per step, as the runner does; the layer's forward reads it.
        t0 = time.perf_counter()
        meta = backend.build_metadata(
            np.ones(1, dtype=np.int64), computed, tables, slot, torch.device("cpu"), block_size
        )
        backend.forward(q, cache, meta, d**-0.5, sliding_window=w)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"full": [], "sliding": []}
    for _ in range(repeats + 1):  # the first round warms up
        times["full"].append(step(None))
        times["sliding"].append(step(window))
    full = FullAttentionSpec(block_size=block_size, dtype=torch.bfloat16, num_kv_heads=hkv, head_size=d)
    n = len(windows)
    # Bytes a request of `context` tokens holds: every layer full, against the pool's groups
    # (groups share tensors: a block id is one page of each of the largest group's layers).
    full_bytes = n * blocks * full.page_size_bytes
    groups = window_groups(windows, full)
    # A request decoding its token at context - 1, as the pool's manager holds it.
    kv = PagedKVCacheManager(
        -(-context // block_size) * len(groups), block_size, sliding_windows=sliding_windows_of(groups)
    )
    kv.allocate_slots("r", 0, context - 1)
    kv.allocate_slots("r", context - 1, 1)
    hybrid_bytes = kv.num_blocks_of("r") * bytes_per_block_of(groups)
    full_ms, slide_ms = min(times["full"][1:]) * 1e3, min(times["sliding"][1:]) * 1e3
    num_sliding = sum(w is not None for w in windows)
    common = {"context": context, "window": window, "layers": f"{num_sliding} sliding of {n}"}
    return [
        {**common, "case": "full layer", "ms_per_layer": full_ms, "kv_mb_per_request": full_bytes / 2**20},
        {
            **common,
            "case": "sliding layer",
            "ms_per_layer": slide_ms,
            "speedup": full_ms / slide_ms,
            "kv_mb_per_request": hybrid_bytes / 2**20,
            "kv_vs_full": hybrid_bytes / full_bytes,
            # What the decode step's attention saves: each sliding layer's difference.
            "step_attention_ms_saved": num_sliding * (full_ms - slide_ms),
        },
    ]
