"""GGML block-quantized weights kept as they are in the .gguf file, and their torch reference.

A quantized [rows, cols] matrix is a uint8 [rows, cols / 32 * block_bytes] tensor: each row is
its own run of 32-value blocks, so rows can be permuted (llama's q/k un-permute) and stacked
(q/k/v, gate/up) exactly as float rows can. Block layouts, as ggml-common.h defines them:

  Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles;  value = d * (q - 8)
  Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes;     value = d * q + m
  Q8_0 (34 bytes): fp16 d, 32 int8;              value = d * q
  (byte j of a 4-bit block holds value j in its low nibble and value j + 16 in its high one)

`dequantize` is the oracle the AVX512 kernels (csrc/ggml_gemv.cpp) are tested against: the
same float32 arithmetic as the gguf package's numpy code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QK = 32  # values per block, for every type here
BF16 = 30  # GGML's id for bf16: the fused decoder's tag for a plain bf16 matrix


@dataclass(frozen=True)
class GGMLType:
    name: str
    id: int  # GGML's enum value (ggml.h), also the kernels' type tag
    block_bytes: int


# The types with native kernels; every other GGML type is dequantized at load.
GGML_TYPES = {t.id: t for t in (GGMLType("Q4_0", 2, 18), GGMLType("Q4_1", 3, 20), GGMLType("Q8_0", 8, 34))}


def row_bytes(ggml_type: int, cols: int) -> int:
    t = GGML_TYPES[ggml_type]
    if cols % QK:
        raise ValueError(f"{t.name} rows hold whole {QK}-value blocks; {cols} values is not a multiple of {QK}")
    return cols // QK * t.block_bytes


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


def dequantize(data: torch.Tensor, ggml_type: int, cols: int) -> torch.Tensor:
    """uint8 [rows, row_bytes] in `ggml_type`'s blocks -> float32 [rows, cols]."""
    t = GGML_TYPES[ggml_type]
    rows = data.shape[0]
    blocks = data.reshape(rows, cols // QK, t.block_bytes)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [rows, nb, 1]
    if t.name == "Q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(rows, cols)
    start = 4 if t.name == "Q4_1" else 2
    qs = blocks[..., start : start + QK // 2]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()  # values 0-15 then 16-31
    if t.name == "Q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).float()
        return (d * q + m).reshape(rows, cols)
    return (d * (q - 8)).reshape(rows, cols)
