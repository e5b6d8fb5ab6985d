"""Time csrc/ggml_gemv.cpp on one GGML type per run: int8 activations (the default for 1-4 decode
rows, and K-quants' 5-8) against the bf16 unpack, best of 5 x 60 calls.

    python scripts/ggml_gemv_speed.py [--n 5632] [--k 2048] [--threads 2] [--rows 1,4,8] [--from-dram] Q8_0 Q4_K Q6_K

--from-dram cycles the calls through copies of the weight that together exceed the last-level
cache (256 MB), as a decode step streams its layers, and adds each time's GB/s.

Weights are random blocks with small finite fp16 scales (the speed does not depend on their
values); the machine should be otherwise quiet.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.ggml_quant import GGML_TYPES, row_bytes

# Byte ranges of each block's fp16 scales (the rest of a block is codes and packed sub-scales).
_FP16_SCALES = {
    "Q4_0": [(0, 2)],
    "Q4_1": [(0, 4)],
    "Q8_0": [(0, 2)],
    "Q4_K": [(0, 4)],
    "Q5_K": [(0, 4)],
    "Q6_K": [(208, 210)],
}


def random_blocks(type_name: str, n: int, k: int) -> torch.Tensor:
    ggml_type = next(t for t, info in GGML_TYPES.items() if info.name == type_name)
    info = GGML_TYPES[ggml_type]
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(n, k // info.block_values, info.block_bytes), dtype=np.uint8)
    for a, b in _FP16_SCALES[type_name]:
        blocks[..., a:b] = (
            rng.uniform(0.002, 0.02, size=(*blocks.shape[:2], (b - a) // 2)).astype(np.float16).view(np.uint8)
        )
    assert blocks[0].size == row_bytes(ggml_type, k)
    return torch.from_numpy(blocks.reshape(n, -1))


def best_ms(fn, calls: int = 60) -> float:
    fn(0)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("types", nargs="+", choices=sorted(_FP16_SCALES))
    ap.add_argument("--n", type=int, default=5632)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,4,8")
    ap.add_argument("--from-dram", action="store_true", help="cycle through 256 MB of copies of the weight")
    args = ap.parse_args()
    kernels = load_cpu_kernels()
    if kernels is None:
        raise SystemExit("the AVX512-BF16 CPU kernels are unavailable on this machine")
    torch.set_num_threads(args.threads)
    print(f"{args.n} x {args.k}, {args.threads} threads: ms per call, int8 activations / bf16 unpack")
    for name in args.types:
        w = random_blocks(name, args.n, args.k)
        copies = [w] + [w.clone() for _ in range(-(-256_000_000 // w.numel()) - 1 if args.from_dram else 0)]
        ggml_type = next(t for t, info in GGML_TYPES.items() if info.name == name)
        cells = []
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, args.k).bfloat16()
            times = []
            for int8 in (True, False):
                times.append(
                    best_ms(
                        lambda i, ws=copies, t=ggml_type, x=x, q=int8: kernels.gemm_ggml_skinny(
                            ws[i % len(ws)], t, x, q
                        )
                    )
                )
            rates = (
                f" ({w.numel() / times[0] / 1e6:.1f} / {w.numel() / times[1] / 1e6:.1f} GB/s)" if args.from_dram else ""
            )
            cells.append(f"{m} rows {times[0]:.3f} / {times[1]:.3f}{rates}")
        print(f"{name:5} {w.numel() / 1e6:6.2f} MB: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
