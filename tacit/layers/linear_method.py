"""LinearMethod: how a linear layer stores its weight and multiplies by it.

create_weights runs when the layer is built (on the meta device, before the checkpoint is
read), process_weights_after_loading once the checkpoint is in, apply on every forward. The
unquantized torch matmul is the reference; faster or quantized methods register beside it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tacit.registry import Registry

SKINNY_ROWS = 32
# Row counts a prefill GEMM is padded to: sixteen sizes an octave (33-64 rows in steps of 2,
# 65-128 in steps of 4, ..., 1025-2048 in steps of 64), so at most 6.25% more rows. oneDNN keeps
# native memory for every GEMM shape it has met, and a prefill step's shape is its token count:
# unpadded, a server meets up to max_num_batched_tokens of them and its RSS rose 549 MB in an
# 8-minute soak (scripts/soak.py); padded to 8 sizes an octave, 113 MB. Eight cost up to 10% on
# a 129-token prefill (-> 144 rows), sixteen ~2% (-> 136): scripts/prefill_padding_speed.py.
# At most 16 x log2(max_num_batched_tokens / 32) shapes per weight: 96 at 2048.
_BUCKETS_PER_OCTAVE_LOG2 = 4


def prefill_rows_bucket(rows: int) -> int:
    """rows rounded up to the next of the bounded set of GEMM row counts (see above)."""
    step = 1 << max(0, (rows - 1).bit_length() - 1 - _BUCKETS_PER_OCTAVE_LOG2)
    return -(-rows // step) * step


class LinearMethod(ABC):
    name: ClassVar[str]
    # Among methods available for a platform and dtype, the lowest priority is chosen.
    priority: ClassVar[int]
    # True for a method chosen per layer from its checkpoint tensor's type (GGML blocks): the
    # model-wide method (use_linear_method) leaves such layers alone.
    per_layer: ClassVar[bool] = False
    # True for a method built on tacit's CPU kernels: an engine with cpu_kernels off skips it.
    uses_cpu_kernels: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def create(cls, platform: str, dtype: torch.dtype) -> LinearMethod | None:
        """This method for a model on `platform` ("cpu", "cuda") in `dtype`, or None where it cannot run."""

    @abstractmethod
    def create_weights(
        self, layer: nn.Module, in_features: int, out_sizes: list[int], bias: bool, dtype: torch.dtype
    ) -> None:
        """Register the layer's parameters (`weight`, and `bias` or None) for sum(out_sizes) outputs."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack or check the loaded weights; nothing to do for a plain matrix."""

    def weight_rows(self, layer: nn.Module, start: int, size: int) -> torch.Tensor:
        """Where output rows [start, start + size) of the weight live (a merged layer's shard)."""
        return layer.weight[start : start + size]

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, in_features] -> [T, out_features]."""


LINEAR_METHODS = Registry("linear_method")
register_linear_method = LINEAR_METHODS.register


def registered_linear_methods() -> dict[str, type[LinearMethod]]:
    """Every method whose module has been imported (tacit/layers/linear.py imports them all)."""
    return dict(LINEAR_METHODS)


@register_linear_method("unquantized")
class UnquantizedLinearMethod(LinearMethod):
    """A [out, in] matrix in the model's dtype, multiplied the way that streams it fastest.

    Decode is memory-bound: a step streams every weight once for a handful of rows. How the
    GEMM is phrased decides how fast it streams on this CPU (oneDNN, 2 cores, bf16, weights
    cold in DRAM, [3072, 576] gate/up; docs/benchmarks.md has the measuring script):
      1 row:      torch.mv 19 GB/s      F.linear 13 GB/s
      2-32 rows:  W @ x.T  12-15 GB/s   F.linear 10-11 GB/s
      64+ rows:   F.linear wins (prefill is compute-bound anyway).
    """

    priority = 100  # the reference: every platform and dtype

    @classmethod
    def create(cls, platform: str, dtype: torch.dtype) -> UnquantizedLinearMethod:
        return cls()

    def create_weights(
        self, layer: nn.Module, in_features: int, out_sizes: list[int], bias: bool, dtype: torch.dtype
    ) -> None:
        out_features = sum(out_sizes)
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        if bias:
            layer.bias = nn.Parameter(torch.empty(out_features, dtype=dtype))
        else:
            layer.register_parameter("bias", None)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return dense_matmul(layer.weight, x, bias)


def dense_matmul(weight: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), phrased by row count as UnquantizedLinearMethod's table says."""
    rows = x.shape[0] if x.dim() == 2 else SKINNY_ROWS + 1
    if rows == 1:
        out = torch.mv(weight, x[0]).unsqueeze(0)
    elif rows <= SKINNY_ROWS:
        out = torch.mm(weight, x.t()).t().contiguous()
    else:
        padded = prefill_rows_bucket(rows) if x.dim() == 2 else rows
        if padded == rows:
            return F.linear(x, weight, bias)
        return F.linear(F.pad(x, (0, 0, 0, padded - rows)), weight, bias)[:rows]
    return out + bias if bias is not None else out
