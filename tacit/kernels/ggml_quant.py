"""GGML block-quantized weights kept as they are in the .gguf file, and their torch reference.

A quantized [rows, cols] matrix is a uint8 [rows, cols / 32 * block_bytes] tensor: each row is
its own run of 32-value blocks, so rows can be permuted (llama's q/k un-permute) and stacked
(q/k/v, gate/up) exactly as float rows can. Block layouts, as ggml-common.h defines them:

  Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles;  value = d * (q - 8)
  Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes;     value = d * q + m
  Q5_0 (22 bytes): fp16 d, 32-bit qh, 16 bytes;  value = d * (q - 16), q = nibble + 16 * bit j of qh
  Q8_0 (34 bytes): fp16 d, 32 int8;              value = d * q
  (byte j of a 4-bit block holds value j in its low nibble and value j + 16 in its high one)
  Q4_K (144 bytes per 256 values): fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins for 8
       sub-blocks of 32, 128 bytes of nibbles (sub-blocks 2i and 2i+1 are the low and high
       nibbles of bytes 32i..32i+31);  value = (d * sc) * q - dmin * m
  Q5_K (176 bytes per 256 values): Q4_K's d, dmin and scales, 32 bytes of fifth bits (bit s of
       byte l for value l of sub-block s), then Q4_K's 128 bytes of nibbles; q = nibble + 16 * bit
  Q6_K (210 bytes per 256 values): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8
       scales (one per 16 values), fp16 d last;  value = (d * sc) * (q - 32)
  MXFP4 (17 bytes): E8M0 exponent e, 16 bytes of FP4 E2M1 nibbles (value j low, j + 16 high);
       value = kvalues_mxfp4[q] * 2^(e - 128): ggml's doubled E2M1 table {0, 1, 2, 3, 4, 6, 8, 12,
       0, -1, ..., -12} (integers, so the int8 kernel multiplies them as codes) times its halved
       scale (GGML_E8M0_TO_FP32_HALF), which is e2m1(q) * 2^(e - 127), the OCP MX value that HF's
       gpt-oss checkpoints hold too (loader/mxfp4_checkpoint.py re-packs those)

and one layout of tacit's own, under a tag outside ggml's enum (never written to a GGUF):

  FP8_E4M3 (36 bytes): fp32 s, 32 float8_e4m3fn;  value = s * e4m3(q)
       An FP8 block-scaled checkpoint's weight (DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8:
       loader/fp8_checkpoint.py), each 32 values of a row carrying the fp32 weight_scale_inv
       of the 128 x 128 block they sit in, so the GEMV and the fused decode step stream it as
       they stream Q8_0 (36 bytes per 32 values: 1.125 bytes a weight against the file's 1.0).

`dequantize` is the oracle the AVX512 kernels (csrc/ggml_gemv.cpp) are tested against: the
same float32 arithmetic as the gguf package's numpy code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QK = 32  # values per block (Q4_K: per sub-block; its blocks hold 256)
BF16 = 30  # GGML's id for bf16: the fused decoder's tag for a plain bf16 matrix
FP8_E4M3 = 200  # tacit's tag for FP8 block-scaled weights (below), outside ggml's enum
MXFP4 = 39  # ggml's id for MXFP4 (gpt-oss's experts)
# ggml's kvalues_mxfp4: the 16 E2M1 values doubled, so that every one is an integer
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@dataclass(frozen=True)
class GGMLType:
    name: str
    id: int  # GGML's enum value (ggml.h), also the kernels' type tag
    block_bytes: int
    block_values: int = QK


# The types with native kernels; every other GGML type is dequantized at load.
GGML_TYPES = {
    t.id: t
    for t in (
        GGMLType("Q4_0", 2, 18),
        GGMLType("Q4_1", 3, 20),
        GGMLType("Q5_0", 6, 22),
        GGMLType("Q8_0", 8, 34),
        GGMLType("Q4_K", 12, 144, 256),
        GGMLType("Q5_K", 13, 176, 256),
        GGMLType("Q6_K", 14, 210, 256),
        GGMLType("MXFP4", MXFP4, 17),
        GGMLType("FP8_E4M3", FP8_E4M3, 36),  # csrc/ggml_gemv.h kF8E4M3
    )
}


def row_bytes(ggml_type: int, cols: int) -> int:
    t = GGML_TYPES[ggml_type]
    if cols % t.block_values:
        raise ValueError(
            f"{t.name} rows hold whole {t.block_values}-value blocks; {cols} values is not a multiple of {t.block_values}"
        )
    return cols // t.block_values * t.block_bytes


@dataclass
class GGMLTensor:
    """A checkpoint tensor still in its GGML blocks: data uint8 [rows, row_bytes(type, cols)]."""

    data: torch.Tensor
    ggml_type: int
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        rows, cols = self.shape
        want = (rows, row_bytes(self.ggml_type, cols))
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ValueError(
                f"{self.type_name} [{rows}, {cols}] is {want[0]} x {want[1]} bytes; "
                f"got {self.data.dtype} {tuple(self.data.shape)}"
            )

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.data, self.ggml_type, self.shape[1]).to(dtype)


@dataclass
class GGMLExpertStack:
    """A GGUF's stacked expert tensor still in its GGML blocks: data uint8
    [experts, rows, row_bytes(type, cols)], one expert's matrix per leading index."""

    data: torch.Tensor
    ggml_type: int
    shape: tuple[int, int, int]

    def __post_init__(self) -> None:
        experts, rows, cols = self.shape
        want = (experts, rows, row_bytes(self.ggml_type, cols))
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ValueError(
                f"{GGML_TYPES[self.ggml_type].name} experts {self.shape} are {want} bytes; "
                f"got {self.data.dtype} {tuple(self.data.shape)}"
            )

    def dequantize_expert(self, expert: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.data[expert], self.ggml_type, self.shape[2]).to(dtype)


def dequantize(data: torch.Tensor, ggml_type: int, cols: int) -> torch.Tensor:
    """uint8 [rows, row_bytes] in `ggml_type`'s blocks -> float32 [rows, cols]."""
    t = GGML_TYPES[ggml_type]
    rows = data.shape[0]
    blocks = data.reshape(rows, cols // t.block_values, t.block_bytes)
    if t.name in ("Q4_K", "Q5_K"):
        return _dequantize_q4_k(blocks).reshape(rows, cols)
    if t.name == "Q6_K":
        return _dequantize_q6_k(blocks).reshape(rows, cols)
    if t.name == "FP8_E4M3":
        s = blocks[..., 0:4].contiguous().view(torch.float32)  # [rows, nb, 1]
        return (blocks[..., 4:].contiguous().view(torch.float8_e4m3fn).float() * s).reshape(rows, cols)
    if t.name == "MXFP4":
        qs = blocks[..., 1:].long()
        q = torch.tensor(KVALUES_MXFP4, dtype=torch.float32)[torch.cat([qs & 0x0F, qs >> 4], dim=-1)]
        return (e8m0_to_fp32_half(blocks[..., 0:1]) * q).reshape(rows, cols)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [rows, nb, 1]
    if t.name == "Q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(rows, cols)
    start = {"Q4_1": 4, "Q5_0": 6}.get(t.name, 2)
    qs = blocks[..., start : start + QK // 2]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()  # values 0-15 then 16-31
    if t.name == "Q5_0":  # bit j of the little-endian 32-bit qh is value j's fifth bit
        qh = blocks[..., 2:6].long()
        qh = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
        bits = (qh.unsqueeze(-1) >> torch.arange(QK)) & 1
        return (d * (q + 16 * bits.float() - 16)).reshape(rows, cols)
    if t.name == "Q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).float()
        return (d * q + m).reshape(rows, cols)
    return (d * (q - 8)).reshape(rows, cols)


def e8m0_to_fp32_half(e: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 exponents -> 2^(e - 128) as float32, ggml's GGML_E8M0_TO_FP32_HALF bit for bit:
    e >= 2 is the normal float with exponent field e - 1; e = 0, 1 (2^-128, 2^-127) are the
    subnormals 0x00200000 and 0x00400000."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32) << e, (e - 1) << 23)
    return bits.view(torch.float32)


def _dequantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """[rows, nb, 144 or 176] -> [rows, nb, 256]: the gguf package's Q4_K and Q5_K arithmetic."""
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()
    dmin = blocks[..., 2:4].contiguous().view(torch.float16).float()
    sc6 = blocks[..., 4:16].int()
    lo, hi, mix = sc6[..., 0:4], sc6[..., 4:8], sc6[..., 8:12]
    sc = torch.cat([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], dim=-1).float()  # [rows, nb, 8]
    mn = torch.cat([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], dim=-1).float()
    five = blocks.shape[-1] == 176  # Q5_K: 32 bytes of fifth bits before the nibbles
    qs = blocks[..., 48 if five else 16 :].reshape(*blocks.shape[:-1], 4, 1, 32)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-2).reshape(*blocks.shape[:-1], 8, 32)
    if five:
        qh = blocks[..., 16:48].unsqueeze(-2)  # [rows, nb, 1, 32]
        q = q | (torch.cat([(qh >> bit) & 1 for bit in range(8)], dim=-2) << 4)
    q = q.float()
    return ((d * sc).unsqueeze(-1) * q - (dmin * mn).unsqueeze(-1)).reshape(*blocks.shape[:-1], 256)


def _dequantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """[rows, nb, 210] -> [rows, nb, 256]: the gguf package's Q6_K arithmetic. 32-value piece s
    of a block: half s // 4; low nibbles of ql bytes 0-31 / 32-63, then high nibbles of the
    same; qh's bit pair 2 * (s % 4)."""
    lead = blocks.shape[:-1]
    ql = blocks[..., :128].reshape(*lead, 2, 1, 64)
    ql = torch.cat([ql & 0x0F, ql >> 4], dim=-2).reshape(*lead, 8, 32)
    qh = blocks[..., 128:192].reshape(*lead, 2, 1, 32)
    qh = torch.cat([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=-2).reshape(*lead, 8, 32)
    q = ((ql | (qh << 4)).int() - 32).reshape(*lead, 16, 16).float()
    sc = blocks[..., 192:208].contiguous().view(torch.int8).float()
    d = blocks[..., 208:210].contiguous().view(torch.float16).float()
    return ((d * sc).unsqueeze(-1) * q).reshape(*lead, 256)
