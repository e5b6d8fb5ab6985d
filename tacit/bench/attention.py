"""`tacit bench attention`: the decode step's attention alone, per KV cache dtype.

Times the C++ paged decode attention kernel (csrc/decode_attention*.cpp) over a model's
attention shape (heads, kv heads, head dim, layers) at a given context, one call per layer on
that layer's own cache, as a decode step runs it. Caches are larger than the CPU's caches at
long contexts (the default model at 4k: 94 MB of bf16 K/V a step), so this is the bandwidth-
bound figure the int8 cache exists for. The dtypes alternate within each repeat, so drift in
the shared cores' speed hits every dtype alike.
"""

from __future__ import annotations

import time

import torch

from tacit.kernels.kv_quant import paged_int8_shape, parse_kv_cache_dtype, write_paged_int8


def attention_shape(hf: dict) -> dict[str, int]:
    heads = int(hf["num_attention_heads"])
    return {
        "num_heads": heads,
        "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
        "head_dim": int(hf.get("head_dim") or hf["hidden_size"] // heads),
        "num_layers": int(hf["num_hidden_layers"]),
    }


def _caches(shape: dict[str, int], dtype: torch.dtype, blocks: int, block_size: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hkv, d = shape["num_kv_heads"], shape["head_dim"]
    out = []
    for _ in range(shape["num_layers"]):
        k = torch.randn(blocks * block_size, hkv, d, generator=g)
        v = torch.randn(blocks * block_size, hkv, d, generator=g)
        if dtype == torch.int8:
            cache = torch.zeros(paged_int8_shape(blocks, block_size, hkv, d), dtype=torch.int8)
            write_paged_int8(cache, torch.arange(blocks * block_size), k, v)
        else:
            cache = torch.stack([k, v]).view(2, blocks, block_size, hkv, d).to(dtype)
        out.append(cache)
    return out


def measure_attention(
    hf: dict, context: int, batch_sizes: list[int], dtypes: list[str], repeats: int, block_size: int = 16
) -> list[dict]:
    """Rows of {batch_size, context, kv_cache_dtype, ms_per_step, kv_gb_per_s, speedup}: speedup
    against the first dtype at the same batch size."""
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None:
        raise RuntimeError("tacit bench attention times the C++ decode kernels, which need AVX512-BF16/VNNI")
    shape = attention_shape(hf)
    scale = shape["head_dim"] ** -0.5
    rows = []
    for m in batch_sizes:
        per_row = -(-context // block_size)
        blocks = m * per_row
        caches = {
            name: _caches(shape, parse_kv_cache_dtype(name, torch.bfloat16), blocks, block_size, 0) for name in dtypes
        }
        q = torch.randn(m, shape["num_heads"], shape["head_dim"]).bfloat16()
        positions = torch.full((m,), context - 1, dtype=torch.int64)
        tables = torch.arange(blocks, dtype=torch.int64).view(m, per_row)
        times: dict[str, list[float]] = {name: [] for name in dtypes}
        for _ in range(repeats + 1):  # the first round warms up
            for name in dtypes:
                t0 = time.perf_counter()
                for cache in caches[name]:
                    kernels.paged_decode_attention(q, cache, positions, tables, scale)
                times[name].append(time.perf_counter() - t0)
        base = None
        for name in dtypes:
            best = min(times[name][1:])
            base = base or best
            kv_bytes = sum(c.numel() * c.element_size() for c in caches[name]) * context / (per_row * block_size)
            rows.append(
                {
                    "batch_size": m,
                    "context": context,
                    "kv_cache_dtype": name,
                    "ms_per_step": best * 1e3,
                    "kv_gb_per_s": kv_bytes / best / 1e9,
                    "speedup": base / best,
                }
            )
        del caches
    return rows
