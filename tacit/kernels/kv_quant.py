"""The int8 KV cache: its layout and its torch reference (quantize on write, dequantize on read).

Each cached row (one token's key or value for one kv head, or an MLA latent) is quantized
symmetrically with its own fp32 scale: q = round-half-even(x / scale) in [-127, 127],
scale = max|x| / 127, value = q * scale (llama.cpp's q8_0 KV and vLLM's per-token-head int8 KV
use the same granularity; head rows have no outlier channels to isolate the way weight rows do).

Paged attention layout, one tensor per layer as for bf16 (so the block pool, swap, a copy
along the block axis, and block tables need no change):

    int8 [2, num_blocks, Hkv, block_size * (D + 4)]
    per (block, kv head): block_size rows of D int8 values, then block_size fp32 scales
    K's values are stored with the sign bit flipped (the byte k + 128 read unsigned), V's as
    they are: vpdpbusd multiplies unsigned by signed bytes, so the kernel feeds K rows to it
    straight from memory instead of flipping them once per query head.

Head-major inside a block, so one head's keys are one contiguous run: the decode kernel
(csrc/decode_attention_int8.cpp) streams 64 bytes a key for SmolLM2's 64-wide heads, and a
tile of 16 keys finds its 16 scales in one cache line. The first version kept bf16's
[block, slot, head] order with the scale after each row: 68-byte rows at a 204-byte stride
touched two cache lines a key, as many as bf16's 128-byte rows, and decoded no faster.

MLA's latent cache keeps one token per row ([num_blocks, block_size, C]): in int8 the latent
and the rotated key part are two rows, each followed by its scale's 4 bytes (pack_rows), values
stored as they are, without K's sign flip (the latent is V too; mla_decode_attention_int8 in
csrc/decode_attention_int8.cpp flips the bytes in registers for its scores).

The C++ kernels (csrc/fused_decode.cpp writes, csrc/decode_attention_int8.cpp reads) use the
same arithmetic, bit for bit on the write side.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # an fp32 scale per row
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "int8")


def parse_kv_cache_dtype(value: str, model_dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype -> the cache tensor's dtype ("auto": the model's)."""
    if value not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={value!r} is not supported; valid: {', '.join(KV_CACHE_DTYPES)}")
    return model_dtype if value == "auto" else getattr(torch, value)


def kv_row_width(width: int, dtype: torch.dtype) -> int:
    """Elements a cached row of `width` values takes in a cache of `dtype` (int8: + its scale)."""
    return width + SCALE_BYTES if dtype == torch.int8 else width


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., D] float -> (int8 [..., D], fp32 scale [...]). An all-zero row gets scale 0 (it reads
    back as zeros); a row holding NaN gets scale NaN (it reads back NaN, as bf16 would)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127.0
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(xf / divisor).clamp_(-127, 127).nan_to_num_(0).to(torch.int8)
    return q, scale.squeeze(-1)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., D] and scale [...] -> [..., D] in `dtype` (q * scale in fp32, rounded once)."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


# ---- paged layout: [2, blocks, Hkv, block_size * (D + 4)] ----


def paged_int8_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    if (block_size * head_dim) % SCALE_BYTES:
        raise ValueError(
            f"an int8 KV cache needs block_size x head_dim divisible by 4 (fp32 scales stay aligned); "
            f"got {block_size} x {head_dim}"
        )
    return (2, num_blocks, num_kv_heads, block_size * (head_dim + SCALE_BYTES))


def paged_int8_views(cache: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's values int8 [2, blocks, Hkv, block_size, D] and scales fp32 [2, blocks, Hkv,
    block_size], as views (writes land in the cache)."""
    width = cache.shape[-1] // block_size - SCALE_BYTES
    values = cache[..., : block_size * width].unflatten(-1, (block_size, width))
    scales = cache[..., block_size * width :].view(torch.float32)
    return values, scales


_SIGN = -128  # 0x80: xor flips the sign bit, k <-> k + 128 as an unsigned byte


def write_paged_int8(cache: torch.Tensor, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """Quantize key/value [T, Hkv, D] into the cache's slots [T] (block * block_size + offset)."""
    values, scales = paged_int8_views(cache, cache.shape[-1] // (key.shape[-1] + SCALE_BYTES))
    block_size = values.shape[3]
    blocks, offsets = slots // block_size, slots % block_size
    for i, x in enumerate((key, value)):
        q, s = quantize_rows(x)
        values[i][blocks, :, offsets] = q ^ _SIGN if i == 0 else q
        scales[i][blocks, :, offsets] = s


def gather_paged_int8(
    cache: torch.Tensor, block_tables: torch.Tensor, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of each request's blocks block_tables [R, B], dequantized -> two [R, B * block_size,
    Hkv, D] tensors in `dtype`."""
    r, b = block_tables.shape
    hkv, width = cache.shape[2], cache.shape[3]
    bs = width // (head_dim + SCALE_BYTES)
    out = []
    for i in range(2):
        half = cache[i]
        rows = torch.index_select(half.reshape(half.shape[0], -1), 0, block_tables.reshape(-1)).view(r, b, hkv, width)
        values, scales = paged_int8_views(rows, bs)  # [R, B, Hkv, bs, D], [R, B, Hkv, bs]
        if i == 0:
            values = values ^ _SIGN
        out.append(dequantize(values, scales, dtype).transpose(2, 3).reshape(r, b * bs, hkv, head_dim))
    return out[0], out[1]


# ---- row layout (MLA latent cache): [..., D + 4] ----


def pack_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> int8 [..., D + 4]: the quantized values, then their scale's bytes."""
    q, s = quantize_rows(x)
    return torch.cat([q, s.unsqueeze(-1).view(torch.int8)], dim=-1)


def unpack_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., D + 4] -> [..., D] in `dtype`."""
    return dequantize(x[..., :-SCALE_BYTES], x[..., -SCALE_BYTES:].contiguous().view(torch.float32).squeeze(-1), dtype)
