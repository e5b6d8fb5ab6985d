"""MoE experts micro-benchmark for fit.py: the engine's experts kernel on this CPU (the C++
cpu_fused_moe: a counting sort into per-expert slots, gate/up with SiLU*up in the epilogue, down
with the routing weight folded in; without the kernels the torch reference), experts in the
engine's dtype, uniformly random top-k routing, against the FLOPs and
bytes operators.py's experts op charges (expected distinct experts read once, rows = token
pairs per expert read).

Why its own curve: a prefill's experts run this kernel at 4-40 rows per expert, where the
linear-method GEMM curve (one [rows, k] x [k, n] per call) does not describe it.
"""

from __future__ import annotations

import sys

import torch

from tacit.perf_model.fit_host import torch_dtype
from tacit.perf_model.fit_small_ops import best_seconds_each
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.operators import Parallel, StepShape, mlp_ops

# Qwen3-MoE-2b-like: 128 experts of 1024 -> 384, top-8; 300 MB of bf16 experts (beyond the L3).
E, H, INTER, TOP_K = 128, 1024, 384, 8
TOKENS = (1, 4, 16, 64, 256, 1024)


def _shape() -> ModelShape:
    return ModelShape("bench", H, 1, 16, 2, 64, 0, 1, True, num_experts=E, top_k=TOP_K, moe_intermediate_size=INTER)


def experts_curve(peak: float, bw: float, repeats: int, dtype: str = "bf16") -> dict:
    """The MoE kernel the engine selects on this CPU in `dtype` (layers/moe.select_moe_kernel):
    the C++ kernel where it loads, else the torch reference (an expert at a time: on an AVX2-only
    EPYC the dense GEMM curve priced random:qwen3-moe-2b's float32 prefills 10-34% under their
    measured time, `tacit predict --validate` before this curve)."""
    from tacit.kernels.moe_kernel import ExpertWeights
    from tacit.layers.moe import select_moe_kernel

    dt = torch_dtype(dtype)
    kernel = select_moe_kernel("cpu", dt)
    weights = ExpertWeights(torch.randn(E, 2 * INTER, H).to(dt) * 0.02, torch.randn(E, H, INTER).to(dt) * 0.02)
    g = torch.Generator().manual_seed(0)
    calls = []
    for t in TOKENS:
        x = torch.randn(t, H).to(dt)
        # a fresh routing each call: one token's 8 experts (19 MB) would otherwise sit in the L3
        sets = [torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(t)]) for _ in range(8)]
        w = torch.softmax(torch.randn(t, TOP_K), dim=-1)
        turn = iter(range(1 << 30))
        calls.append(lambda x=x, w=w, s=sets, n=turn: kernel.experts(x, w, s[next(n) % 8], weights))
    rows, effs = [], []
    for t, secs in zip(TOKENS, best_seconds_each(calls, repeats)):
        op = next(o for o in mlp_ops(_shape(), StepShape(t, 1, 0), Parallel(), dtype, 32) if o.name == "experts")
        rows.append(round(op.rows, 3))
        # not capped at 1 (a GEMM may beat bench hw's one probe shape): see fit._gemm_curve
        effs.append(round(max(op.flops / peak, op.bytes / bw) / secs, 4))
        print(
            f"  experts {type(kernel).__name__} {t} tokens ({op.rows:.1f} rows/expert): {secs * 1e3:.2f} ms, eff {effs[-1]:.3f}",
            file=sys.stderr,
        )
    return {"rows": rows, "eff": effs}
