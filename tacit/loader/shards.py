"""A tensor-parallel rank's slice of each checkpoint tensor, cut as the tensors stream in.

A safetensors shard is read with get_slice, so a rank reads only its bytes (loader/hf.py); a
GGUF's tensors are views of the mapped file, so slicing touches only the rank's pages; both
go through narrow_tensor. GGML blocks slice by rows freely, and by columns only at whole blocks.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from tacit.kernels.ggml_quant import GGML_TYPES, GGMLTensor

# (dim, start, length) of the tensor one rank loads; None: a tensor this rank never reads (an
# expert another rank holds, under expert parallelism).
Shard = tuple[int, int, int] | None


def narrow_tensor(name: str, tensor: torch.Tensor | GGMLTensor, shard: Shard) -> torch.Tensor | GGMLTensor:
    dim, start, length = shard
    shape = tuple(tensor.shape)
    if dim >= len(shape) or start + length > shape[dim]:
        raise ValueError(
            f"checkpoint tensor {name} has shape {shape}; a tensor-parallel rank needs [{start}, {start + length}) "
            f"of dim {dim}: config and weights disagree"
        )
    if isinstance(tensor, GGMLTensor):
        rows, cols = tensor.shape
        if dim == 0:
            return GGMLTensor(tensor.data[start : start + length].contiguous(), tensor.ggml_type, (length, cols))
        t = GGML_TYPES[tensor.ggml_type]
        if start % t.block_values or length % t.block_values:
            # The rank's columns cut through a block: it takes them dequantized instead.
            return tensor.dequantize()[:, start : start + length].contiguous()
        b0, b1 = start // t.block_values * t.block_bytes, (start + length) // t.block_values * t.block_bytes
        return GGMLTensor(tensor.data[:, b0:b1].contiguous(), tensor.ggml_type, (rows, length))
    return tensor.narrow(dim, start, length).contiguous()


def narrowed(
    weights: Iterable[tuple[str, torch.Tensor | GGMLTensor]], shards: dict[str, Shard]
) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
    for name, tensor in weights:
        shard = shards.get(name, ())
        if shard is None:
            continue
        yield name, tensor if shard == () else narrow_tensor(name, tensor, shard)
