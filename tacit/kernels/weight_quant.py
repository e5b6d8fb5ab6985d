"""Weight-only quantization of a Hugging Face checkpoint at load (--quantization int8 | int4).

The result is stored in GGML blocks that tacit already runs, not in a layout of its own: the
AVX512 GEMV over GGML blocks (csrc/ggml_gemv.cpp), the fused C++ decode step (which takes a
GGML type per projection) and the prefill path (dequantize, then the dense matmul) all run
these layers unchanged, and they already stream Q8_0/Q4_1 at the memory-bandwidth limit. One
implementation of a quantized matmul, whichever checkpoint the blocks came from.

  int8, per output channel, symmetric: d = max|row| / 127, q = round(w / d) in -127..127.
       Stored as Q8_0 blocks in which every 32-value block of a row carries the row's d.
       With a group size (32, 64 or 128 values of a row), d = max|group| / 127 instead: group
       32 is llama.cpp's Q8_0 exactly, at the same 8.5 bits (the blocks store a scale anyway).
  int4, group-wise (g = 32, 64 or 128 values of a row), asymmetric: d = (max - min) / 15,
       m = min, q = round((w - m) / d) in 0..15, w ~ d * q + m. Stored as Q4_1 blocks in which
       every 32-value block of a group carries the group's d and m.

The price of reusing the layouts is the repeated fp16 scale: int8 costs 8.5 bits a weight
(34 bytes per 32 values, +6% over one scale per row), int4 costs 5 bits a weight whatever g
(20 bytes per 32), not the 4.125-4.25 of one scale (and min) per group. Numerically each is
exactly the per-channel / group-wise scheme: dequantize(blocks) == d * q (+ m) with the
stored fp16 d and m.

d and m are rounded to fp16 before q is computed, so the stored blocks are self-consistent,
and rounded outward (d up, m down) so that every value of the row or group lies inside the
grid: |w - dequantized| <= d / 2 holds for every element, q never needs clamping, and a tiny
but nonzero range gets the smallest fp16 step rather than a scale of 0. A zero range (an
all-zero row, a constant group) has d = 0 and q = 0: the value is m (0 for int8), never NaN.
"""

from __future__ import annotations

import torch

from tacit.kernels.ggml_quant import GGML_TYPES, QK, GGMLTensor

Q4_1, Q8_0 = 3, 8
assert GGML_TYPES[Q4_1].name == "Q4_1" and GGML_TYPES[Q8_0].name == "Q8_0"
GROUP_SIZES = (32, 64, 128)  # values of a row per int4 scale and min, or per int8 scale


def _fp16_up(x: torch.Tensor) -> torch.Tensor:
    """The smallest fp16 value >= x (float32), as float16."""
    h = x.to(torch.float16)
    return torch.where(h.float() < x, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


def _fp16_down(x: torch.Tensor) -> torch.Tensor:
    """The largest fp16 value <= x (float32), as float16."""
    h = x.to(torch.float16)
    return torch.where(h.float() > x, torch.nextafter(h, torch.full_like(h, float("-inf"))), h)


def _check_matrix(w: torch.Tensor, group: int, what: str) -> None:
    if w.dim() != 2:
        raise ValueError(f"{what} quantizes a 2-D weight; got shape {tuple(w.shape)}")
    if w.shape[1] % group:
        raise ValueError(f"{what}: rows of {w.shape[1]} values are not whole groups of {group}")


def _finite_fp16(d: torch.Tensor, what: str) -> None:
    if not torch.isfinite(d).all():
        raise ValueError(f"{what}: a weight is not finite or too large for an fp16 scale (max 65504)")


def int8_per_channel_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [rows, cols] -> (q int8 [rows, cols], d float16 [rows]): w ~ d * q."""
    _check_matrix(w, QK, "int8")
    q, d = _int8_params(w.float().unsqueeze(1), "int8")
    return q.reshape(w.shape), d.squeeze(1)


def int8_groupwise_params(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float [rows, cols] -> (q int8 [rows, cols], d float16 [rows, cols / group]): w ~ d * q,
    d that of the value's group."""
    _check_group_size(group, "int8")
    _check_matrix(w, group, "int8")
    rows, cols = w.shape
    q, d = _int8_params(w.float().reshape(rows, cols // group, group), "int8")
    return q.reshape(rows, cols), d


def _int8_params(g: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float [rows, groups, n] -> (q int8 [rows, groups, n], d float16 [rows, groups])."""
    d = _fp16_up(g.abs().amax(dim=2) / 127)
    _finite_fp16(d, what)
    df = d.float().unsqueeze(2)
    q = torch.where(df > 0, torch.round(g / torch.where(df > 0, df, 1.0)), 0.0)
    return q.clamp_(-127, 127).to(torch.int8), d


def _check_group_size(group: int, what: str) -> None:
    if group not in GROUP_SIZES:
        raise ValueError(f"{what} group size {group} is not supported; valid: {', '.join(map(str, GROUP_SIZES))}")


def int4_groupwise_params(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float [rows, cols] -> (q uint8 0..15 [rows, cols], d, m float16 [rows, cols / group]):
    w ~ d * q + m, d and m those of the value's group."""
    _check_group_size(group, "int4")
    _check_matrix(w, group, "int4")
    rows, cols = w.shape
    g = w.float().reshape(rows, cols // group, group)
    m = _fp16_down(g.amin(dim=2))
    d = _fp16_up((g.amax(dim=2) - m.float()) / 15)
    _finite_fp16(d, "int4")
    _finite_fp16(m, "int4")
    df, mf = d.float().unsqueeze(2), m.float().unsqueeze(2)
    q = torch.where(df > 0, torch.round((g - mf) / torch.where(df > 0, df, 1.0)), 0.0)
    return q.clamp_(0, 15).to(torch.uint8).reshape(rows, cols), d, m


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float16 [...] -> uint8 [..., 2], little-endian as GGML stores it."""
    # flattened first: a [N, 1] tensor may be "contiguous" with a last stride other than 1
    return x.contiguous().reshape(-1).view(torch.uint8).reshape(*x.shape, 2)


def pack_q8_0(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q int8 [rows, cols], d float16 [rows] (one scale a row) or [rows, groups] -> uint8
    [rows, cols / 32 * 34] Q8_0 blocks, each block of a group carrying the group's d."""
    rows, cols = q.shape
    nb = cols // QK
    d = d.reshape(rows, -1)
    scale = _fp16_bytes(d).repeat_interleave(nb // d.shape[1], dim=1)
    blocks = torch.cat([scale, q.contiguous().view(torch.uint8).reshape(rows, nb, QK)], dim=2)
    return blocks.reshape(rows, nb * 34)


def pack_q4_1(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """q uint8 0..15 [rows, cols], d, m float16 [rows, groups] -> uint8 [rows, cols / 32 * 20]
    Q4_1 blocks, each block of a group carrying the group's d and m."""
    rows, cols = q.shape
    nb = cols // QK
    per = nb // d.shape[1]  # blocks per group
    d_bytes = _fp16_bytes(d).repeat_interleave(per, dim=1)
    m_bytes = _fp16_bytes(m).repeat_interleave(per, dim=1)
    qb = q.reshape(rows, nb, QK)
    nibbles = qb[..., : QK // 2] | (qb[..., QK // 2 :] << 4)  # byte j: value j low, value j + 16 high
    return torch.cat([d_bytes, m_bytes, nibbles], dim=2).reshape(rows, nb * 20)


def quantize_int8_per_channel(w: torch.Tensor) -> GGMLTensor:
    """float [rows, cols] (cols a multiple of 32) -> per-output-channel int8 as Q8_0 blocks."""
    q, d = int8_per_channel_params(w)
    return GGMLTensor(pack_q8_0(q, d), Q8_0, tuple(w.shape))


def quantize_int8_groupwise(w: torch.Tensor, group: int) -> GGMLTensor:
    """float [rows, cols] (cols a multiple of group) -> group-wise symmetric int8 as Q8_0 blocks."""
    q, d = int8_groupwise_params(w, group)
    return GGMLTensor(pack_q8_0(q, d), Q8_0, tuple(w.shape))


def quantize_int4_groupwise(w: torch.Tensor, group: int = 32) -> GGMLTensor:
    """float [rows, cols] (cols a multiple of group) -> group-wise asymmetric int4 as Q4_1 blocks."""
    q, d, m = int4_groupwise_params(w, group)
    return GGMLTensor(pack_q4_1(q, d, m), Q4_1, tuple(w.shape))
