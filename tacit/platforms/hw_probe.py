"""This machine's ceilings — memory bandwidth and matmul FLOP/s: what `tacit bench hw` prints,
`tacit predict --hardware this-cpu` and the profiler's roofline read (a platform fact, so it sits
here, below the benchmarks and the performance model that use it).

Decode at small batch reads every weight once per step, so tok/s is bounded by
bandwidth / weight bytes; the other benchmarks report their fraction of that roofline.
"""

from __future__ import annotations

import time

import torch


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first touch of pages, oneDNN kernel selection
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def memory_bandwidth(size_mb: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a large read+write copy: counts both directions, as STREAM's copy does."""
    n = size_mb * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / seconds


def read_bandwidth(size_mb: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a pure streaming read (an fp32 sum; a bf16 sum is conversion-bound here)."""
    n = size_mb * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)
    seconds = _best_seconds(lambda: src.sum(), repeats)
    return n * 4 / seconds


def gemv_bandwidth(n: int = 16384, repeats: int = 5) -> float:
    """Bytes/s a bf16 matrix-vector product streams: the practical ceiling of batch-1 decode."""
    w, x = torch.ones(n, n, dtype=torch.bfloat16), torch.ones(1, n, dtype=torch.bfloat16)
    seconds = _best_seconds(lambda: torch.nn.functional.linear(x, w), repeats)
    return n * n * 2 / seconds


def kernel_gemv_bandwidth(n: int = 16384, repeats: int = 5) -> float | None:
    """Bytes/s tacit's AVX512-BF16 GEMV streams (None without the kernel). On this machine it
    reads faster than the fp32 sum above (prefetching 8 rows ahead keeps more loads in flight),
    so it, not the sum, is the ceiling a decode step can approach."""
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None:
        return None
    w, x = torch.ones(n, n, dtype=torch.bfloat16), torch.ones(1, n, dtype=torch.bfloat16)
    return n * n * 2 / _best_seconds(lambda: kernels.gemm_bf16_skinny(w, x), repeats)


def peak_read_bandwidth() -> float:
    """The fastest streaming read measured here: the roofline decode is reported against."""
    return max(read_bandwidth(), kernel_gemv_bandwidth() or 0.0)


def matmul_flops(dtype: torch.dtype, n: int = 2048, repeats: int = 10, budget_s: float = 3.0) -> float:
    """Best of `repeats`: a 1024^3 bf16 matmul takes ~2 ms with AMX, and on the shared 2-core
    machine the best of 3 read 294 GFLOP/s where an undisturbed run reads 1,130 (calibration.py
    refits when this moves by over 20%, so the least disturbed of many is the figure to keep).
    The size halves until the repeats fit in `budget_s`: where bf16 has no oneDNN path (an
    AVX2-only EPYC: 0.9 GFLOP/s) one 2048^3 bf16 matmul alone would take 18 s."""
    probe = min(n, 256)
    a, b = torch.randn(probe, probe, dtype=dtype), torch.randn(probe, probe, dtype=dtype)
    rate = 2 * probe**3 / _best_seconds(lambda: a @ b, 1)
    while n > probe and (repeats + 1) * 2 * n**3 / rate > budget_s:
        n //= 2
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    seconds = _best_seconds(lambda: a @ b, repeats)
    return 2 * n**3 / seconds


def peak_matmul_flops() -> float:
    """The faster of bf16 and float32 matmuls: the compute roof, whichever dtype the platform
    runs (bf16 where oneDNN has it; float32 on CPUs where bf16 is a scalar fallback)."""
    return max(matmul_flops(torch.bfloat16), matmul_flops(torch.float32))


def measure() -> dict[str, float]:
    return {
        "threads": float(torch.get_num_threads()),
        "read_GBps": read_bandwidth() / 1e9,
        "copy_GBps": memory_bandwidth() / 1e9,
        "bf16_gemv_GBps": gemv_bandwidth() / 1e9,
        "tacit_gemv_GBps": (kernel_gemv_bandwidth() or float("nan")) / 1e9,
        "bf16_matmul_TFLOPs": matmul_flops(torch.bfloat16) / 1e12,
        "fp32_matmul_TFLOPs": matmul_flops(torch.float32) / 1e12,
    }
