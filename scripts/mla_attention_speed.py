"""MLA decode attention's speed against its two floors: the latent cache's bytes over this
machine's read bandwidth, and its multiply-adds at the vdpbf16ps peak.

    python scripts/mla_attention_speed.py [--threads 2] [--context 4096] [--heads 16] [--layers 8]

`mla_decode_attention` (csrc/decode_attention_op.cpp; the absorbed backend's decode kernel) over
a bf16 paged latent cache of DeepSeek-V3's widths (rank 512 + rope 64), one and eight requests.
Each call reads one of `--layers` distinct caches in turn (8 x 4.7 MB at 4k context, more than
the L3), so the latents come from DRAM as in a real decode step rather than from the cache the
previous call left warm. Prints the best and median call time, the GFLOP/s it implies, and the
ratio to the bytes floor (the issue-13 target is at most 1.2x).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.platforms.hw_probe import peak_read_bandwidth

RANK, ROPE, BLOCK = 512, 64, 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--layers", type=int, default=8, help="distinct caches cycled (their total should exceed L3)")
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    kernels = load_cpu_kernels()
    if kernels is None:
        raise SystemExit("the AVX512-BF16 CPU kernels are not available on this machine")
    bandwidth = peak_read_bandwidth()  # the whole machine's, measured before the thread count is set
    torch.set_num_threads(args.threads)
    ctx, heads = args.context, args.heads
    for reqs in (1, 8):
        blocks = -(-(ctx + 1) // BLOCK)
        cache = torch.randn(args.layers * reqs * blocks + 1, BLOCK, RANK + ROPE).bfloat16()
        perm = np.random.default_rng(0).permutation(args.layers * reqs * blocks)
        tables = [torch.from_numpy(t).long() for t in perm.reshape(args.layers, reqs, blocks)]
        positions = torch.full((reqs,), ctx, dtype=torch.long)
        q = torch.randn(reqs, heads, RANK + ROPE).bfloat16()

        for layer in range(args.layers):
            kernels.mla_decode_attention(q, cache, positions, tables[layer], 0.07, RANK)
        times = []
        for i in range(args.calls):
            t = time.perf_counter()
            kernels.mla_decode_attention(q, cache, positions, tables[i % args.layers], 0.07, RANK)
            times.append(time.perf_counter() - t)
        best = min(times)
        flop = 2 * reqs * (ctx + 1) * heads * (RANK + ROPE + RANK)
        floor = reqs * (ctx + 1) * (RANK + ROPE) * 2 / bandwidth
        print(
            f"{reqs} request(s), {args.threads} thread(s): best {best * 1e3:.3f} ms (median "
            f"{np.median(times) * 1e3:.3f}), {flop / best / 1e9:.0f} GFLOP/s; bytes / {bandwidth / 1e9:.1f} GB/s "
            f"= {floor * 1e3:.3f} ms -> {best / floor:.1f}x"
        )


if __name__ == "__main__":
    main()
