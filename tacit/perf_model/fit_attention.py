"""Prefill attention micro-benchmark for fit.py: tacit's torch_paged backend itself (KV write
into the paged cache, the per-request gather, SDPA with the boolean causal mask and GQA), on a
batch of whole prompts, divided by the roofline time of the FLOPs and bytes operators.py
charges (causal: T(T+1)/2 key positions per prompt).

The previous benchmark timed SDPA(is_causal=True) on 16 heads with no mask: that kernel skips
the masked half, the engine's masked call does not (it scores every padded key, ~2x the causal
count), and the gather and KV write were not in it.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch

from tacit.perf_model.fit_host import torch_dtype
from tacit.perf_model.fit_small_ops import best_seconds, best_seconds_each
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.operators import Parallel, StepShape, attention_ops

BLOCK = 16
# (prompts, prompt length, query heads, KV heads, head_dim): Qwen3-100m's (12/4 x 64) and
# Qwen3-MoE-2b's (16/2 x 128) heads, 32 to 1024 tokens: a curve by prompt length, since
# the fixed costs weigh on short prompts (0.03 of peak at 64 tokens, 0.07-0.09 at 512-1024).
SHAPES = (
    (16, 32, 16, 2, 128),
    (4, 64, 12, 4, 64),
    (1, 512, 12, 4, 64),
    (4, 256, 16, 2, 128),
    (1, 1024, 16, 2, 128),
)


def causal_fraction_scored(t: float) -> float:
    """Of the keys torch_paged scores for one of this benchmark's prompts of `t` tokens (each
    query against every key of the prompt's whole blocks: t x ceil(t / BLOCK) x BLOCK), the
    fraction the causal count charges (t (t + 1) / 2): the frame the fitted prefill curve is in.
    0.52 at 32 tokens, 0.50 at 1024."""
    t = max(float(t), 1.0)
    return (t + 1) / 2 / (math.ceil(t / BLOCK) * BLOCK)


def _shape(hq: int, hkv: int, d: int, layers: int = 1) -> ModelShape:
    return ModelShape("bench", hq * d, layers, hq, hkv, d, 0, 1, True)


def _slots(tables: np.ndarray, starts: int | np.ndarray, t: int) -> np.ndarray:
    """The flat cache slots of positions start .. start + t - 1 of each request's block table
    (one start for all requests, or each its own)."""
    slots = (tables[:, :, None] * BLOCK + np.arange(BLOCK)[None, None, :]).reshape(len(tables), -1)
    starts = np.broadcast_to(starts, (len(tables),))
    return np.concatenate([slots[i, s : s + t] for i, s in enumerate(starts)])


def _run(
    prompts: int,
    t: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype = torch.bfloat16,
    cached: int | tuple[int, ...] = 0,
    layers: int = 1,
):
    """One step of `prompts` requests with `t` new tokens each after `cached` ones (one count
    for all, or each request's: the backend groups decodes by context), on `layers` layers' own
    caches (a decode step streams each layer's cache from DRAM)."""
    from tacit.kernels.torch_attention import TorchAttentionBackend

    c = np.broadcast_to(np.asarray(cached, dtype=np.int64), (prompts,))
    per = int(-(-(c.max() + t) // BLOCK))
    caches = [torch.randn(2, prompts * per, BLOCK, hkv, d).to(dtype) for _ in range(layers)]
    tables = np.arange(prompts * per, dtype=np.int64).reshape(prompts, per)
    backend = TorchAttentionBackend()
    n = np.full(prompts, t, dtype=np.int64)
    meta = backend.build_metadata(n, c, tables, _slots(tables, c, t), torch.device("cpu"), BLOCK)
    q = torch.randn(prompts * t, hq, d).to(dtype)
    k, v = torch.randn(prompts * t, hkv, d).to(dtype), torch.randn(prompts * t, hkv, d).to(dtype)

    def step() -> torch.Tensor:
        # each layer's output dropped before the next, as the engine's layers consume theirs:
        # keeping 12 layers' outputs alive timed the same decode 21-37 ms against 13.5 ms
        for cache in caches:
            backend.write_kv(cache, k, v, meta)
            out = backend.forward(q, cache, meta, d**-0.5)
        return out

    return step


# batch 8 at a 1024-token context, 2 KV heads of 128, 6 layers' caches (8 x 1024 x 2 x 2 x 128 x
# 4 bytes = 17 MB a layer in float32, 100 MB a step: beyond the L3), 2 to 16 query heads
DECODE_BATCH, DECODE_CONTEXT, DECODE_KV_HEADS, DECODE_HEAD_DIM, DECODE_LAYERS = 8, 1024, 2, 128, 6
DECODE_GROUPS = (1, 2, 4, 8)


def torch_decode_attention_curve(peak: float, bw: float, repeats: int, dtype: str) -> dict:
    """The torch_paged backend's decode (a CPU without the C++ kernels: the engine's decode path
    there) as operators' decode attention op prices it, by GQA group (query heads per KV head).
    By group because torch's SDPA expands K and V to every query head: over the same 100 MB of
    float32 KV on an AVX2-only EPYC, 1/2/4/8 query heads per KV head took 8.7 / 13.2 / 14.2 /
    44.3 ms, so one efficiency fitted at 8 priced random:qwen3-100m's (3) decode attention at
    twice its time (`tacit predict --validate`: +43% to +83% at batch 4 x 1024)."""
    dt = torch_dtype(dtype)
    b, ctx, hkv, d, layers = DECODE_BATCH, DECODE_CONTEXT - 1, DECODE_KV_HEADS, DECODE_HEAD_DIM, DECODE_LAYERS
    calls = [_run(b, 1, g * hkv, hkv, d, dt, ctx, layers) for g in DECODE_GROUPS]
    effs = []
    for g, secs in zip(DECODE_GROUPS, best_seconds_each(calls, repeats)):
        op = attention_ops(_shape(g * hkv, hkv, d, layers), StepShape(b, 1, ctx), Parallel(), dtype, dtype, 32)[-1]
        effs.append(round(min(max(op.flops / peak, op.bytes / bw) / secs, 1.0), 4))
        print(
            f"  decode attention (torch) {g} query heads a KV head: {secs * 1e3:.2f} ms, eff {effs[-1]:.3f}",
            file=sys.stderr,
        )
    return {"rows": list(DECODE_GROUPS), "eff": effs}


# Two decodes in one padded group (both at 3 blocks) and in two (1 block and 3): the same step
# but for one more group's gather, padding and SDPA call, and 2 blocks fewer to read.
ONE_GROUP, TWO_GROUPS = (47, 47), (15, 47)


def torch_decode_group_seconds(repeats: int, dtype: str) -> float:
    """A decode step's cost, per layer, of each padded group past the first on the torch_paged
    backend: host work the bytes do not describe. On the AVX2-only EPYC in float32, SmolLM2's
    heads (9/3 x 64) at 30 layers: 177 us a layer for two decodes in one group, 304 in two;
    a bursty-replay step of 33 decodes runs 6 groups (power-of-two context buckets)."""
    from tacit.kernels.torch_attention import group_requests

    dt = torch_dtype(dtype)
    # 24 layers (the caches are a few blocks): a difference of two ~5 ms steps read 122-150 us in
    # four runs, where 6 layers' ~1.5 ms steps read 122-284 us in three
    hkv, d, layers = DECODE_KV_HEADS, DECODE_HEAD_DIM, 24
    contexts = (ONE_GROUP, TWO_GROUPS)
    if [len(group_requests(np.ones(2, dtype=np.int64), np.array(c), BLOCK)) for c in contexts] != [1, 2]:
        raise RuntimeError(f"decodes at {ONE_GROUP} and {TWO_GROUPS} no longer run in 1 and 2 groups")
    one, two = best_seconds_each([_run(2, 1, 2 * hkv, hkv, d, dt, c, layers) for c in contexts], repeats)
    extra = max((two - one) / layers, 0.0)
    print(f"  decode attention (torch): {extra * 1e6:.1f} us a layer for a second padded group", file=sys.stderr)
    return round(extra, 8)


def _by_length(points: list[tuple[int, float]]) -> dict:
    points.sort()
    return {"rows": [t for t, _ in points], "eff": [round(min(e, 1.0), 4) for _, e in points]}


def prefill_attention_efficiency(peak: float, bw: float, repeats: int, dtype: str = "bf16") -> dict:
    """Efficiency by prompt length (operators' attention op's rows in a prefill), in the engine's
    compute dtype here (bf16, or fp32 on a CPU without a native bf16 matmul)."""
    points = []
    dt = torch_dtype(dtype)
    for prompts, t, hq, hkv, d in SHAPES:
        secs = best_seconds(_run(prompts, t, hq, hkv, d, dt), repeats)
        op = attention_ops(_shape(hq, hkv, d), StepShape(prompts, t, 0), Parallel(), dtype, dtype, 32)[-1]
        points.append((t, max(op.flops / peak, op.bytes / bw) / secs))
        print(
            f"  prefill attention {prompts}x{t} {hq}/{hkv}x{d}: {secs * 1e3:.2f} ms, eff {points[-1][1]:.3f}",
            file=sys.stderr,
        )
    return _by_length(points)


# random:deepseek-v3-1b-like MLA absorption: 16 heads, latent 512, nope = v = 128; 6 layers'
# distinct weights (2 x 2 MB each) so successive calls stream from DRAM as a decode step does.
BMM_HEADS, BMM_RANK, BMM_NOPE, BMM_LAYERS = 16, 512, 128, 24
BMM_ROWS = (1, 4, 16, 64)


def absorbed_bmm_curve(peak: float, bw: float, repeats: int, dtype: str = "bf16") -> dict:
    """MLA's absorbed decode projections as absorbed_mla_attention.absorbed_attend runs them:
    q_nope @ W_UK [H, nope, rank] and o_latent @ W_UV^T [H, rank, v], on csrc/head_bmm.cpp where
    the CPU kernels run (the engine's bf16 decode) and torch's bf16 bmm otherwise, against
    operators' kv_b_absorbed count (2 m H rank (nope + v) FLOPs, the weight once, activations in
    and out)."""
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels() if dtype == "bf16" else None
    dt = torch_dtype(dtype)
    size = dt.itemsize
    h, r, n = BMM_HEADS, BMM_RANK, BMM_NOPE
    w_uk = [torch.randn(h, n, r).to(dt) for _ in range(BMM_LAYERS)]
    w_uv = [torch.randn(h, r, n).to(dt) for _ in range(BMM_LAYERS)]
    effs = []
    for m in BMM_ROWS:
        if kernels is not None:  # x [m, H, K], as absorbed_attend passes it
            q, o = torch.randn(m, h, n).bfloat16(), torch.randn(m, h, r).bfloat16()
            project = kernels.head_bmm_bf16
        else:
            q, o = torch.randn(h, m, n).to(dt), torch.randn(h, m, r).to(dt)
            project = torch.bmm
        secs = best_seconds(lambda q=q, o=o, f=project: [(f(q, a), f(o, b)) for a, b in zip(w_uk, w_uv)], repeats)
        flops = BMM_LAYERS * 2 * m * h * r * 2 * n
        # the weights at their dtype's size; activations at operators' bf16 count (ACT), which
        # the efficiency absorbs
        nbytes = BMM_LAYERS * (h * r * 2 * n * size + m * h * r * 2 * 2)
        # not capped at 1 (a GEMM may beat bench hw's one probe shape): see fit._gemm_curve
        effs.append(round(max(flops / peak, nbytes / bw) / secs, 4))
        print(f"  absorbed bmm rows {m}: {secs * 1e3:.2f} ms, eff {effs[-1]:.3f}", file=sys.stderr)
    return {"rows": list(BMM_ROWS), "eff": effs}


# DeepSeek-V3's MLA widths (latent 512, rope 64, nope 128, v 128), 16 heads; (prompts, length)
MLA_HEADS, MLA_RANK, MLA_ROPE, MLA_NOPE, MLA_V = 16, 512, 64, 128, 128
# 32 tokens too: below its shortest point a curve is flat, a guess for the short prompts
MLA_PROMPTS = ((16, 32), (4, 128), (1, 512))


def _mla_shape() -> ModelShape:
    return ModelShape(
        "bench", 1024, 1, MLA_HEADS, MLA_HEADS, 0, 0, 1, True, kv_lora_rank=MLA_RANK,
        qk_nope_head_dim=MLA_NOPE, qk_rope_head_dim=MLA_ROPE, v_head_dim=MLA_V,
    )  # fmt: skip


def _mla_run(prompts: int, t: int, dtype: torch.dtype = torch.bfloat16):
    from tacit.kernels.absorbed_mla_attention import AbsorbedMLAAttentionBackend

    per = -(-t // BLOCK)
    cache = torch.zeros(prompts * per, BLOCK, MLA_RANK + MLA_ROPE, dtype=dtype)
    tables = np.arange(prompts * per, dtype=np.int64).reshape(prompts, per)
    backend = AbsorbedMLAAttentionBackend()
    n, c = np.full(prompts, t, dtype=np.int64), np.zeros(prompts, dtype=np.int64)
    meta = backend.build_metadata(n, c, tables, _slots(tables, 0, t), torch.device("cpu"), BLOCK)
    q = torch.randn(prompts * t, MLA_HEADS, MLA_NOPE + MLA_ROPE).to(dtype)
    latent, pe = torch.randn(prompts * t, MLA_RANK).to(dtype), torch.randn(prompts * t, MLA_ROPE).to(dtype)
    kv_b = (torch.randn(MLA_HEADS * (MLA_NOPE + MLA_V), MLA_RANK) * 0.02).to(dtype)

    def step() -> torch.Tensor:
        backend.write_kv(cache, latent, pe, meta)
        return backend.forward(q, cache, meta, 0.1, kv_b_proj=kv_b)

    return step


def mla_prefill_attention_efficiency(peak: float, bw: float, repeats: int, gemm, dtype: str = "bf16") -> dict:
    """A fresh MLA prompt as the engine runs it (the absorbed backend picks the naive path: the
    latents up-projected by kv_b_proj to 16 heads' K and V, then SDPA with the mask, qk width 192
    against v 128), net of operators' kv_b_proj GEMM as `gemm` (`dtype`'s curve) predicts it, against the
    attention op's roofline time. The GQA benchmark's figure does not carry over: this path ran
    ~4x slower per FLOP (random:deepseek-v3-1b, 4 x 256 tokens: 1279 ms measured in attention
    against 303 ms predicted with it)."""
    points = []
    for prompts, t in MLA_PROMPTS:
        secs = best_seconds(_mla_run(prompts, t, torch_dtype(dtype)), repeats, fresh_heap=True)
        ops = {o.name: o for o in attention_ops(_mla_shape(), StepShape(prompts, t, 0), Parallel(), dtype, dtype, 32)}
        proj = ops["kv_b_proj"]
        proj_s = max(proj.flops / peak, proj.bytes / bw) / gemm(proj.rows)
        att = ops["attention"]
        points.append((t, max(att.flops / peak, att.bytes / bw) / max(secs - proj_s, 1e-9)))
        print(f"  MLA prefill attention {prompts}x{t}: {secs * 1e3:.2f} ms, eff {points[-1][1]:.3f}", file=sys.stderr)
    return _by_length(points)
