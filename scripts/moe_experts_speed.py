"""The MoE experts kernel's streaming rate at decode, against the bf16 GEMV over the same bytes.

random:qwen3-moe-2b's experts (128 x [768, 1024] gate/up and [1024, 384] down, bf16, a 302 MB
stack: beyond the caches) through `moe_experts` for B tokens, each call routed to fresh random
distinct experts so the weights come from DRAM; then `gemm_bf16_skinny` over one matrix of the
same bytes per call for the same B activation rows (B <= 8), cycled through six copies. Prints
the median of 60 calls as GB/s.

    python scripts/moe_experts_speed.py [B]
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

from tacit.kernels.cpu_kernels import load_cpu_kernels

E, H, INTER, TOP_K = 128, 1024, 384, 8
BF16 = 30  # the GGML type id the kernels take for plain bf16 weights


def median_seconds(fn, calls: int = 60, warm: int = 10) -> float:
    for i in range(warm):
        fn(i)
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    k = load_cpu_kernels()
    if k is None:
        sys.exit("the AVX512-BF16 kernels are not available on this CPU")
    torch.manual_seed(0)
    w13 = torch.randn(E, 2 * INTER, H).bfloat16() * 0.02
    w2 = torch.randn(E, H, INTER).bfloat16() * 0.02
    x = torch.randn(batch, H).bfloat16()
    rng = np.random.default_rng(0)
    routes = [
        torch.from_numpy(np.stack([rng.choice(E, TOP_K, replace=False) for _ in range(batch)])).long()
        for _ in range(64)
    ]
    weights = torch.full((batch, TOP_K), 1.0 / TOP_K)
    moe_s = median_seconds(
        lambda i: k.moe_experts(x, weights, routes[i % 64], w13, BF16, w2, BF16, None, BF16, None, BF16, None, True)
    )
    moe_bytes = np.mean([len(set(r.flatten().tolist())) for r in routes]) * 3 * INTER * H * 2
    rows = TOP_K * 3 * INTER * H // 1024
    big = torch.randn(6 * rows, 1024).bfloat16()
    gemv_s = median_seconds(lambda i: k.gemm_bf16_skinny(big[(i % 6) * rows : (i % 6 + 1) * rows], x))
    gemv_bytes = rows * 1024 * 2
    print(f"experts, {batch} token(s): {moe_s * 1e3:.3f} ms, {moe_bytes / moe_s / 1e9:.1f} GB/s")
    print(f"bf16 GEMV, {batch} row(s), same bytes: {gemv_s * 1e3:.3f} ms, {gemv_bytes / gemv_s / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
