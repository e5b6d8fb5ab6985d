"""Micro-benchmarks of the non-GEMM, non-attention work, for fit.py: one decoder layer's
elementwise ops and the sampler, run with tacit's own modules and divided by the same byte
counts operators.py charges them (layer_elementwise_bytes, sampler_bytes).

Each time is taken net of the same ops' fixed cost (their time on 1 row, or on the tiny
models' 512-entry vocabulary): that launch and Python cost is already in the step and layer
overheads fitted on tiny models (fit._overheads), which run these same ops.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tacit.perf_model.operators import layer_elementwise_bytes, sampler_bytes

# A Qwen3-MoE-2b-like layer: hidden 1024, MLP width 3072, 16 query and 2 KV heads of 128 with
# per-head q/k norms. Rows span a decode batch's tens to a 16x256 prompt batch (4096 rows).
HIDDEN, WIDTH, HEADS_Q, HEADS_KV, HEAD_DIM = 1024, 3072, 16, 2, 128
ELEMENTWISE_ROWS = (64, 256, 1024, 4096)
SAMPLER_ROWS = (1, 4, 16, 64)
VOCAB, TINY_VOCAB = 32000, 512  # the validated models' vocabulary; fit._tiny_model's


def _malloc_trim() -> None:
    """Hand the heap's free memory back to the OS (glibc), so the next call's temporaries land
    on fresh pages that fault in, as they do inside an engine process (below)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def best_seconds(fn: Callable[[], object], repeats: int, fresh_heap: bool = False) -> float:
    """Best of `repeats` timed calls after a warm-up: the least disturbed on a shared machine.

    fresh_heap: trim the heap before each call. A bare loop may reuse the previous call's freed
    temporaries, an engine process does not: the MLA prefill path (4 x 256 tokens) took 58-60 ms
    a call in a fresh process, 93-98 ms with random:deepseek-v3-1b's engine resident, 60 ms
    with it resident under MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_=4G (no page returned),
    and 107 ms with the heap trimmed before each call; in the engine's own prefill 85-93 ms."""
    import time

    fn()
    best = float("inf")
    for _ in range(repeats):
        if fresh_heap:
            _malloc_trim()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def best_seconds_each(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Best of `repeats` timed calls of each fn, the calls interleaved round-robin after one
    warm-up each. One point of a curve timed back to back can fall wholly inside a slow patch of
    a shared machine: a calibration here read its bf16 GEMM at 8 rows 2.3x slower than at 16
    (32.2 against 13.9 ms for 3x less work), and bf16 matmuls moved 648 -> 1268 GFLOP/s between
    two fits minutes apart. Interleaved, each point's repeats spread over the whole curve's
    time, so a patch shorter than that costs a point one repeat, not all of them."""
    import time

    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _layer_ops(rows: int, dtype: torch.dtype = torch.bfloat16) -> Callable[[], object]:
    """The torch path's elementwise work in one layer, on tacit's modules, in the engine's dtype."""
    from tacit.layers.norm import RMSNorm
    from tacit.layers.rotary import RotaryEmbedding

    norm, head_norm = RMSNorm(HIDDEN).to(dtype), RMSNorm(HEAD_DIM).to(dtype)
    rope = RotaryEmbedding(HEAD_DIM, 4096, {"rope_theta": 1e6, "rope_type": "default"})
    cos, sin = rope.cos_sin(torch.arange(rows), dtype)
    x, attn_out = torch.randn(rows, HIDDEN).to(dtype), torch.randn(rows, HIDDEN).to(dtype)
    gate_up = torch.randn(rows, 2 * WIDTH).to(dtype)
    q = torch.randn(rows, HEADS_Q, HEAD_DIM).to(dtype)
    k = torch.randn(rows, HEADS_KV, HEAD_DIM).to(dtype)

    def run() -> object:
        h = norm(x)
        r = x + attn_out
        qn, kn = head_norm(q), head_norm(k)
        rope(qn, kn, cos, sin)
        h = norm(r)
        gate, up = gate_up.chunk(2, dim=-1)  # tacit's MLP splits its fused gate_up output so
        act = F.silu(gate) * up
        return r + h, act

    return run


def elementwise_curve(bw: float, repeats: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Against operators' bf16 byte count (ACT): in float32 the efficiency absorbs the doubling."""
    fixed = best_seconds(_layer_ops(1, dtype), repeats * 4)
    effs, sizes = [], []
    for rows in ELEMENTWISE_ROWS:
        t = best_seconds(_layer_ops(rows, dtype), repeats) - fixed
        nbytes = layer_elementwise_bytes(rows, HIDDEN, WIDTH, (HEADS_Q + HEADS_KV) * HEAD_DIM, True)
        sizes.append(nbytes)
        effs.append(round(min(1.0, nbytes / bw / max(t, 1e-9)), 4))
        print(
            f"  elementwise rows {rows} ({nbytes / 1e6:.1f} MB): {t * 1e3:.3f} ms net of {fixed * 1e3:.3f}, "
            f"eff {effs[-1]:.3f}",
            file=sys.stderr,
        )
    return {"bytes": sizes, "eff": effs}  # by bytes one layer moves: operators.Op.working_set


def _sample(rows: int, vocab: int, dtype: torch.dtype = torch.bfloat16) -> Callable[[], object]:
    from tacit.layers.sampler import Sampler, SamplingMetadata
    from tacit.sampling_params import SamplingParams

    logits = torch.randn(rows, vocab).to(dtype)  # lm_head's output dtype
    meta = SamplingMetadata([SamplingParams(temperature=0.0)] * rows, [[] for _ in range(rows)], [None] * rows)
    sampler = Sampler()
    return lambda: sampler(logits, meta)


def sampling_curve(bw: float, repeats: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    effs = []
    for rows in SAMPLER_ROWS:
        big, tiny = _sample(rows, VOCAB, dtype), _sample(rows, TINY_VOCAB, dtype)
        t = best_seconds(big, repeats * 4) - best_seconds(tiny, repeats * 4)
        effs.append(round(min(1.0, sampler_bytes(rows, VOCAB) / bw / max(t, 1e-9)), 4))
        print(f"  sampler rows {rows}: {t * 1e3:.3f} ms net, eff {effs[-1]:.3f}", file=sys.stderr)
    return {"rows": list(SAMPLER_ROWS), "eff": effs}


def best_of_each(measures: list[Callable[[], Any]], repeats: int) -> list[Any]:
    """best_seconds_each for measurements that time themselves (an engine's decode step, a
    TTFT): each called `repeats` times round-robin, its smallest result kept (a measure that
    returns a tuple of times, e.g. a run's decode step and TTFT: the smallest of each). The
    fixed-cost fits take a difference of two depths, and one depth measured wholly in a slow
    patch skews it: a 6-layer prefill read 86.7 ms in one calibration against 53.8-59.6 in three
    others, and the validation's 32-token prefills then read +83%."""
    runs = [[measure() for measure in measures] for _ in range(repeats)]
    return [_smallest(results) for results in zip(*runs)]


def _smallest(results: tuple) -> Any:
    return tuple(map(min, zip(*results))) if isinstance(results[0], tuple) else min(results)
