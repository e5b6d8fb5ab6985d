"""Linear layers whose weight stays in its GGUF file's GGML blocks (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4).

Chosen per layer from the type of the checkpoint tensor it loads (ggml_linear_method in
layers/linear.py, asked by models/quantization.py), not per model: a GGUF file may mix types. The weight is the file's bytes,
uint8 [out, in / 32 * block_bytes], rows stacked for merged layers (a merged layer whose
shards mix types: MixedGGMLLinearMethod). Decode (1-8 rows) runs kernels/csrc/ggml_gemv.cpp,
which streams a Q4_1 weight at 20 bytes per 32 values instead of bf16's 64 and multiplies its
integer codes with int8-rounded activations (or unpacks blocks to bf16 in registers); 9-32 rows
take it 8 rows a pass. More rows (prefill) dequantize the whole matrix to the activations' dtype, then
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
# (kGgmlChunkedRows in csrc/fused_decode.cpp, measured there).
_CHUNKED_ROWS = 32


class GGMLLinearMethod(LinearMethod):
    """Not in the model-wide registry (select_linear_method): the checkpoint picks it per layer,
    and its tests are tests/kernels/test_ggml_kernels.py rather than the float conformance suite."""

    name = "ggml"
    priority = 1000  # never the model-wide choice: see create
    per_layer = True

    def __init__(self, ggml_type: int, kernels: ModuleType | None, int8_activations: bool = True) -> None:
        """int8_activations: decode rows against int8-rounded activations (llama.cpp's) or bf16
        ones (csrc/ggml_gemv.h): the engine's EngineArgs.ggml_bf16_activations, negated."""
        if ggml_type not in GGML_TYPES:
            raise ValueError(f"GGML type {ggml_type} has no native linear method")
        self.ggml_type, self.kernels, self.int8_activations = ggml_type, kernels, int8_activations
        self.type_name = GGML_TYPES[ggml_type].name

    @classmethod
    def create(cls, platform: str, dtype: torch.dtype) -> None:
        return None  # chosen per layer from its checkpoint tensor's type (ggml_linear_method)

    @classmethod
    def for_type(
        cls,
        ggml_type: int,
        platform: str,
        dtype: torch.dtype,
        cpu_kernels: bool | None = None,
        int8_activations: bool = True,
    ) -> GGMLLinearMethod:
        """cpu_kernels: the engine's ModelConfig.cpu_kernels (None: the environment's default)."""
        return cls(ggml_type, _kernels_for(platform, dtype, cpu_kernels), int8_activations)

    def type_of_shard(self, index: int) -> int:
        """The GGML type of a merged layer's shard `index` (checkpoint order)."""
        return self.ggml_type

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
        return _dequantized(layer.weight, self.ggml_type, layer.in_features, dtype, self.kernels)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.kernels is not None and x.dim() == 2 and 0 < x.shape[0] <= _CHUNKED_ROWS and x.dtype == torch.bfloat16:
            out = _skinny(self.kernels, layer.weight, self.ggml_type, x.contiguous(), self.int8_activations)
            return out + bias if bias is not None else out
        return dense_matmul(self.dequantized(layer, x.dtype), x, bias)


class MixedGGMLLinearMethod(GGMLLinearMethod):
    """A merged layer (q/k/v, gate/up) whose checkpoint shards are GGML blocks of different types:
    llama.cpp's Q4_K_M keeps attn_v in Q6_K beside Q4_K q and k in 10 of a Llama's 22 layers.
    Each shard keeps its own type, their blocks one after another in a flat uint8 weight, and
    each multiplies as its own matrix into its columns of the output. Dequantizing those layers
    at load instead streamed their q/k/v in bf16 (random:llama-1b Q4_K_M: 741 MB a token
    instead of 667: `tacit bench latency`'s weights column)."""

    name = "ggml_mixed"

    def __init__(self, shard_types: list[int], kernels: ModuleType | None, int8_activations: bool = True) -> None:
        for t in shard_types:
            if t not in GGML_TYPES:
                raise ValueError(f"GGML type {t} has no native linear method")
        self.shard_types, self.kernels, self.int8_activations = list(shard_types), kernels, int8_activations
        self.ggml_type = None  # no one type: linear_ggml_type callers must look at segments()
        self.type_name = "/".join(GGML_TYPES[t].name for t in shard_types)

    @classmethod
    def for_types(
        cls,
        shard_types: list[int],
        platform: str,
        dtype: torch.dtype,
        cpu_kernels: bool | None = None,
        int8_activations: bool = True,
    ) -> MixedGGMLLinearMethod:
        return cls(shard_types, _kernels_for(platform, dtype, cpu_kernels), int8_activations)

    def type_of_shard(self, index: int) -> int:
        return self.shard_types[index]

    def create_weights(
        self, layer: nn.Module, in_features: int, out_sizes: list[int], bias: bool, dtype: torch.dtype
    ) -> None:
        if len(out_sizes) != len(self.shard_types):
            raise ValueError(f"{len(out_sizes)} shards but {len(self.shard_types)} GGML types ({self.type_name})")
        self._rows = [(n, row_bytes(t, in_features)) for n, t in zip(out_sizes, self.shard_types)]
        data = torch.empty(sum(n * rb for n, rb in self._rows), dtype=torch.uint8)
        layer.weight = nn.Parameter(data, requires_grad=False)
        if bias:
            layer.bias = nn.Parameter(torch.empty(sum(out_sizes), dtype=dtype))
        else:
            layer.register_parameter("bias", None)

    def _views(self, weight: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for n, rb in self._rows:
            views.append(weight[offset : offset + n * rb].view(n, rb))
            offset += n * rb
        return views

    def segments(self, layer: nn.Module) -> list[tuple[torch.Tensor, int]]:
        """(uint8 [rows, row bytes], GGML type) per shard, in output order."""
        return list(zip(self._views(layer.weight.data), self.shard_types))

    def weight_rows(self, layer: nn.Module, start: int, size: int) -> torch.Tensor:
        first = 0
        for (n, _), view in zip(self._rows, self._views(layer.weight)):
            if (first, n) == (start, size):
                return view
            first += n
        raise ValueError(f"rows [{start}, {start + size}) are not one shard of this {self.type_name} layer")

    def dequantized(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([_dequantized(w, t, layer.in_features, dtype, self.kernels) for w, t in self.segments(layer)])

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.kernels is not None and x.dim() == 2 and 0 < x.shape[0] <= _CHUNKED_ROWS and x.dtype == torch.bfloat16:
            x = x.contiguous()
            int8 = self.int8_activations
            out = torch.cat([_skinny(self.kernels, w, t, x, int8) for w, t in self.segments(layer)], dim=1)
            return out + bias if bias is not None else out
        return dense_matmul(self.dequantized(layer, x.dtype), x, bias)


def _kernels_for(platform: str, dtype: torch.dtype, cpu_kernels: bool | None = None) -> ModuleType | None:
    if platform == "cpu" and dtype == torch.bfloat16:
        from tacit.kernels.cpu_kernels import load_cpu_kernels

        return load_cpu_kernels(cpu_kernels)
    return None


def _skinny(kernels: ModuleType, weight: torch.Tensor, ggml_type: int, x: torch.Tensor, int8: bool) -> torch.Tensor:
    """x (bf16, at most _CHUNKED_ROWS rows) @ the blocks' matrix^T, _KERNEL_ROWS rows a pass."""
    parts = [
        kernels.gemm_ggml_skinny(weight, ggml_type, x[i : i + _KERNEL_ROWS], int8)
        for i in range(0, x.shape[0], _KERNEL_ROWS)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _dequantized(
    weight: torch.Tensor, ggml_type: int, in_features: int, dtype: torch.dtype, kernels: ModuleType | None
) -> torch.Tensor:
    """The blocks as a [out, in] matrix in `dtype` (the kernels' dequantize rounds once to bf16)."""
    if kernels is not None and dtype == torch.bfloat16:
        return kernels.ggml_dequantize(weight, ggml_type, in_features)
    return dequantize(weight, ggml_type, in_features).to(dtype)


def linear_ggml_type(layer: nn.Module) -> int | None:
    """The GGML type a linear layer's weight is stored in, or None for a float matrix. A merged
    layer of mixed GGML types has none: a caller binding its weight to a kernel asks
    weight_parts, or refuses it."""
    method = layer.linear_method
    if isinstance(method, MixedGGMLLinearMethod):
        raise ValueError(f"{method.type_name} shards in one layer: a kernel taking one weight type cannot run it")
    return method.ggml_type if isinstance(method, GGMLLinearMethod) else None


def ggml_or_bf16(layer: nn.Module) -> int:
    """The type tag the C++ kernels read a linear's weight as: its GGML type, or BF16 (30)."""
    ggml_type = linear_ggml_type(layer)
    return BF16 if ggml_type is None else ggml_type


def weight_parts(layer: nn.Module) -> tuple[list[torch.Tensor], list[int]]:
    """A linear's weight as the fused decode step takes a projection: its matrices in output
    order and each one's type tag (one part, unless the layer mixes GGML types)."""
    method = layer.linear_method
    if isinstance(method, MixedGGMLLinearMethod):
        parts = method.segments(layer)
        return [w for w, _ in parts], [t for _, t in parts]
    return [layer.weight.data], [ggml_or_bf16(layer)]
