"""bf16 linear layers on a CPU with AVX512-BF16: 1-8 activation rows through one weight pass.

1-8 rows go to kernels/csrc/gemv_bf16.cpp: one pass over the weight for all rows (SmolLM2's
30 layers: 10.8 ms at 4 rows and 13.3 ms at 8 against oneDNN's 15.3 and 15.9 ms;
docs/benchmarks.md has the script). More rows take the reference's torch phrasing. Weights
are stored as the reference stores them, so the model runner can switch a built and loaded
model to this method.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.layers.linear_method import UnquantizedLinearMethod, register_linear_method

_KERNEL_ROWS = 8  # kernels/csrc/gemv_bf16.cpp: 1-8 activation rows per weight pass (kMaxSkinnyRows)


@register_linear_method("cpu_bf16_gemv")
class CpuBf16GemvLinearMethod(UnquantizedLinearMethod):
    priority = 10
    uses_cpu_kernels = True

    def __init__(self, kernels: ModuleType) -> None:
        self.kernels = kernels

    @classmethod
    def create(cls, platform: str, dtype: torch.dtype) -> CpuBf16GemvLinearMethod | None:
        if platform != "cpu" or dtype != torch.bfloat16:
            return None
        kernels = load_cpu_kernels(True)  # None without AVX512-BF16 or after a failed build
        return None if kernels is None else cls(kernels)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # Checked once here so apply need not check every call.
        w = layer.weight
        if w.dtype != torch.bfloat16 or w.device.type != "cpu":
            raise ValueError(f"{self.name} takes bf16 CPU weights; this layer's are {w.dtype} on {w.device}")

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() == 2 and 0 < x.shape[0] <= _KERNEL_ROWS:  # no rows: the kernel takes 1-8
            out = self.kernels.gemm_bf16_skinny(layer.weight, x.contiguous())
            return out + bias if bias is not None else out
        return super().apply(layer, x, bias)
