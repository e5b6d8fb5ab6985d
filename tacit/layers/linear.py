"""Linear layers for the decode hot path.

Decode is memory-bound: a step streams every weight once for a handful of rows. How the
GEMM is phrased decides how fast it streams on this CPU (oneDNN, 2 cores, bf16, weights
cold in DRAM, [3072, 576] gate/up; docs/benchmarks.md has the measuring script):
  1 row:      torch.mv 19 GB/s      F.linear 13 GB/s
  2-32 rows:  W @ x.T  12-15 GB/s   F.linear 10-11 GB/s
  64+ rows:   F.linear wins (prefill is compute-bound anyway).
With AVX512-BF16, 1-8 rows go to kernels/csrc/gemv_bf16.cpp instead: one pass over the
weight for all rows (SmolLM2's 30 layers: 10.8 ms at 4 rows and 13.3 ms at 8 against
oneDNN's 15.3 and 15.9 ms; docs/benchmarks.md has the script).

MergedLinear stacks several projections that read the same input (q/k/v, gate/up) into one
weight: one GEMM launch instead of three, and a longer, more bandwidth-friendly row stream.
Checkpoint tensors keep their HF names and land in their slice through load_shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


_SKINNY_ROWS = 32
_KERNEL_ROWS = 8  # kernels/csrc/gemv_bf16.cpp: 1-8 activation rows per weight pass (kMaxSkinnyRows)
# Set by the model runner when it runs bf16 on a CPU with AVX512-BF16 (kernels/cpu_kernels.py).
bf16_gemv = None


def enable_bf16_gemv(kernel) -> None:
    global bf16_gemv
    bf16_gemv = kernel


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.shape[0] if x.dim() == 2 else _SKINNY_ROWS + 1
    if rows <= _KERNEL_ROWS and bf16_gemv is not None and weight.dtype == torch.bfloat16 and weight.device.type == "cpu":
        out = bf16_gemv.gemm_bf16_skinny(weight, x.contiguous())
    elif rows == 1:
        out = torch.mv(weight, x[0]).unsqueeze(0)
    elif rows <= _SKINNY_ROWS:
        out = torch.mm(weight, x.t()).t().contiguous()
    else:
        return F.linear(x, weight, bias)
    return out + bias if bias is not None else out


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class MergedLinear(nn.Module):
    def __init__(self, in_features: int, out_sizes: list[int], shard_names: list[str], bias: bool = False) -> None:
        super().__init__()
        self.out_sizes, self.shard_names = list(out_sizes), list(shard_names)
        self.weight = nn.Parameter(torch.empty(sum(out_sizes), in_features))
        self.bias = nn.Parameter(torch.empty(sum(out_sizes))) if bias else None
        self._offsets = dict(zip(shard_names, [sum(out_sizes[:i]) for i in range(len(out_sizes))]))
        self._sizes = dict(zip(shard_names, out_sizes))
        self._loaded: set[tuple[str, str]] = set()

    def load_shard(self, shard: str, kind: str, tensor: torch.Tensor) -> None:
        param = self.weight if kind == "weight" else self.bias
        if param is None:
            raise ValueError(f"checkpoint has a {shard}.bias but the config says this layer has no bias")
        start, size = self._offsets[shard], self._sizes[shard]
        if tensor.shape[0] != size or tensor.shape[1:] != param.shape[1:]:
            raise ValueError(f"checkpoint tensor {shard}.{kind} has shape {tuple(tensor.shape)}, "
                             f"the model expects {(size, *param.shape[1:])}: config and weights disagree")
        with torch.no_grad():
            param[start:start + size].copy_(tensor)
        self._loaded.add((shard, kind))

    def check_fully_loaded(self, name: str) -> None:
        kinds = ["weight"] + (["bias"] if self.bias is not None else [])
        missing = [f"{s}.{k}" for s in self.shard_names for k in kinds if (s, k) not in self._loaded]
        if missing:
            raise ValueError(f"checkpoint is missing {', '.join(missing)} for {name}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
