"""Linear layers whose weight stays in its GGUF file's GGML blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K).

Chosen per layer from the type of the checkpoint tensor it loads (use_ggml_weights in
layers/linear.py), not per model: a GGUF file may mix types. The weight is the file's bytes,
uint8 [out, in / 32 * block_bytes], rows stacked for merged layers. Decode (1-8 rows) runs
kernels/csrc/ggml_gemv.cpp, which dequantizes each 32-value block to bf16 in registers and
streams the Q4_1 weight at 20 bytes per 32 values instead of bf16's 64; 9-32 rows take it 8
rows a pass. More rows (prefill) dequantize the whole matrix to the activations' dtype, then
multiply as the unquantized method does. Without the CPU kernels (no AVX512-BF16, float32, another platform) the torch
reference dequantizes; it is what the kernels are tested against.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from tacit.kernels.ggml_quant import BF16, GGML_TYPES, dequantize, row_bytes
from tacit.layers.linear_method import LinearMethod, dense_matmul

_KERNEL_ROWS = 8  # kernels/csrc/ggml_gemv.cpp: 1-8 activation rows per weight pass (kMaxSkinnyRows)
# Up to 32 rows, 8 rows a pass over the blocks beats dequantizing the matrix for oneDNN
# (kGgmlChunkedRows in csrc/llama_decode.cpp, measured there).
_CHUNKED_ROWS = 32


class GGMLLinearMethod(LinearMethod):
    """Not in the model-wide registry (select_linear_method): the checkpoint picks it per layer,
    and its tests are tests/kernels/test_ggml_kernels.py rather than the float conformance suite."""

    name = "ggml"
    priority = 1000  # never the model-wide choice: see create
    per_layer = True

    def __init__(self, ggml_type: int, kernels: ModuleType | None) -> None:
        if ggml_type not in GGML_TYPES:
            raise ValueError(f"GGML type {ggml_type} has no native linear method")
        self.ggml_type, self.kernels = ggml_type, kernels
        self.type_name = GGML_TYPES[ggml_type].name

    @classmethod
    def create(cls, platform: str, dtype: torch.dtype) -> None:
        return None  # chosen per layer from its checkpoint tensor's type (use_ggml_weights)

    @classmethod
    def for_type(cls, ggml_type: int, platform: str, dtype: torch.dtype) -> GGMLLinearMethod:
        kernels = None
        if platform == "cpu" and dtype == torch.bfloat16:
            from tacit.kernels.cpu_kernels import load_cpu_kernels

            kernels = load_cpu_kernels()
        return cls(ggml_type, kernels)

    def create_weights(
        self, layer: nn.Module, in_features: int, out_sizes: list[int], bias: bool, dtype: torch.dtype
    ) -> None:
        out_features = sum(out_sizes)
        data = torch.empty(out_features, row_bytes(self.ggml_type, in_features), dtype=torch.uint8)
        layer.weight = nn.Parameter(data, requires_grad=False)
        if bias:
            layer.bias = nn.Parameter(torch.empty(out_features, dtype=dtype))
        else:
            layer.register_parameter("bias", None)

    def dequantized(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a [out, in] matrix in `dtype` (the kernels' dequantize rounds once to bf16)."""
        if self.kernels is not None and dtype == torch.bfloat16:
            return self.kernels.ggml_dequantize(layer.weight, self.ggml_type, layer.in_features)
        return dequantize(layer.weight, self.ggml_type, layer.in_features).to(dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.kernels is not None and x.dim() == 2 and x.shape[0] <= _CHUNKED_ROWS and x.dtype == torch.bfloat16:
            x = x.contiguous()
            parts = [
                self.kernels.gemm_ggml_skinny(layer.weight, self.ggml_type, x[i : i + _KERNEL_ROWS])
                for i in range(0, x.shape[0], _KERNEL_ROWS)
            ]
            out = parts[0] if len(parts) == 1 else torch.cat(parts)
            return out + bias if bias is not None else out
        return dense_matmul(self.dequantized(layer, x.dtype), x, bias)


def linear_ggml_type(layer: nn.Module) -> int | None:
    """The GGML type a linear layer's weight is stored in, or None for a float matrix."""
    method = layer.linear_method
    return method.ggml_type if isinstance(method, GGMLLinearMethod) else None


def ggml_or_bf16(layer: nn.Module) -> int:
    """The type tag the C++ kernels read a linear's weight as: its GGML type, or BF16 (30)."""
    ggml_type = linear_ggml_type(layer)
    return BF16 if ggml_type is None else ggml_type
