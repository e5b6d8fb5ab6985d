"""`tacit bench attention --dsa`: one DeepSeek-V3.2 layer's attention, sparse against dense.

At a model's MLA shape (random:deepseek-v32-attn has V3.2's own) and a context, batch-1 decode
in bf16: dense absorbed MLA over the whole latent cache (kernels/absorbed_mla_attention.py, the
C++ decode kernel on an AVX512-BF16 CPU) against DSA (kernels/sparse_mla_attention.py): the
indexer's query and head-weight projections, its scores over every cached index key, the
top-k, and absorbed MLA over the selected rows. Both read the same latents; the two alternate
within each repeat, so drift in the shared cores' speed hits both alike. The issue's target:
DSA at least 4x faster at 32k context. KV bytes per token are printed for both kinds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from tacit.kernels.absorbed_mla_attention import AbsorbedMLAAttentionBackend
from tacit.kernels.sparse_mla_attention import dsa_cache_views, sparse_mla_forward, write_dsa_kv
from tacit.kernels.torch_mla_attention import MLADims
from tacit.kv_cache_interface import MLAAttentionSpec, MLAIndexerAttentionSpec


def dsa_attention_case(
    hf: dict, context: int, block_size: int = 16, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor], MLAAttentionSpec, MLAIndexerAttentionSpec]:
    """(dense(), sparse(), dense spec, DSA spec): two closures computing the same decode query's
    attention output [1, H, v] over one random context of `context` tokens."""
    for key in ("kv_lora_rank", "index_topk", "index_n_heads", "index_head_dim", "q_lora_rank"):
        if hf.get(key) is None:
            raise ValueError(
                f"--dsa needs a DeepSeek-V3.2 config (kv_lora_rank, index_* and q_lora_rank); {key} is missing"
            )
    g = torch.Generator().manual_seed(seed)
    heads, rank, rope = int(hf["num_attention_heads"]), int(hf["kv_lora_rank"]), int(hf["qk_rope_head_dim"])
    nope, v, q_lora = int(hf["qk_nope_head_dim"]), int(hf["v_head_dim"]), int(hf["q_lora_rank"])
    ih, idim, topk = int(hf["index_n_heads"]), int(hf["index_head_dim"]), int(hf["index_topk"])
    hidden = int(hf["hidden_size"])

    def rand(*shape: int, std: float = 1.0, as_dtype: torch.dtype = dtype) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(as_dtype)

    blocks = -(-context // block_size)
    dense_spec = MLAAttentionSpec(block_size=block_size, dtype=dtype, kv_lora_rank=rank, rope_dim=rope)
    dsa_spec = MLAIndexerAttentionSpec(
        block_size=block_size, dtype=dtype, kv_lora_rank=rank, rope_dim=rope, index_head_dim=idim
    )
    backend = AbsorbedMLAAttentionBackend()
    meta = backend.build_metadata(
        np.array([1]),
        np.array([context - 1]),
        np.arange(blocks)[None, :],
        np.arange(context),  # every token written now; the decode token is the last
        torch.device("cpu"),
        block_size,
    )
    latent, k_pe, index_key = rand(context, rank), rand(context, rope), rand(context, idim)
    dense_cache = torch.zeros(dense_spec.kv_cache_shape(blocks), dtype=dtype)
    backend.write_kv(dense_cache, latent, k_pe, meta)
    dsa_cache = torch.zeros(dsa_spec.kv_cache_shape(blocks), dtype=dtype)
    latent_cache, index_cache = dsa_cache_views(
        dsa_cache, block_size, dsa_spec.latent_numel_per_token, dsa_spec.index_numel_per_token
    )
    write_dsa_kv(latent_cache, index_cache, meta.slot_mapping, latent, k_pe, index_key)
    meta.slot_mapping = meta.slot_mapping[-1:]
    kv_b = rand(heads * (nope + v), rank, std=rank**-0.5)
    q = rand(1, heads, nope + rope)
    wq_b, q_resid = rand(ih * idim, q_lora, std=q_lora**-0.5), rand(1, q_lora)
    weights_proj, x = rand(ih, hidden, std=hidden**-0.5, as_dtype=torch.float32), rand(1, hidden)
    scale = (nope + rope) ** -0.5
    dims = MLADims.of(q, latent_cache, kv_b)

    def dense() -> torch.Tensor:
        return backend.forward(q, dense_cache, meta, scale, kv_b_proj=kv_b)

    def sparse() -> torch.Tensor:
        q_idx = F.linear(q_resid, wq_b).view(1, ih, idim)
        weights = F.linear(x.float(), weights_proj) * ih**-0.5
        return sparse_mla_forward(
            q, q_idx, weights, latent_cache, index_cache, meta, kv_b, dims, scale, idim**-0.5, topk
        )

    return dense, sparse, dense_spec, dsa_spec


def measure_dsa_attention(hf: dict, context: int, repeats: int, block_size: int = 16) -> list[dict]:
    """Rows of {attention, context, ms_per_call, kv_bytes_per_token, speedup} (speedup against dense)."""
    dense, sparse, dense_spec, dsa_spec = dsa_attention_case(hf, context, block_size)
    times: dict[str, list[float]] = {"dense": [], "dsa": []}
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round warms up
            for name, fn in (("dense", dense), ("dsa", sparse)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    best = {name: min(t[1:]) for name, t in times.items()}
    labels = {"dense": "dense absorbed MLA", "dsa": f"DSA (indexer + top-{hf['index_topk']} MLA)"}
    specs = {"dense": dense_spec, "dsa": dsa_spec}
    return [
        {
            "attention": labels[name],
            "context": context,
            "ms_per_call": best[name] * 1e3,
            "kv_bytes_per_token": specs[name].bytes_per_token,
            "speedup": best["dense"] / best[name],
        }
        for name in ("dense", "dsa")
    ]
