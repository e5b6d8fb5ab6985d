"""Every registered attention backend and linear method against a direct reference on random data.

Attention: one step of mixed decodes and prefill chunks over a paged cache whose block tables
are shuffled and cross block boundaries; the reference attends each token to its request's
dense K/V, one token at a time. Linear: the reference matmul in float32 at the row counts
where the phrasing changes (1: mv, 2-8: GEMV kernel, 9-32: mm, 33+: F.linear).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from paged_steps import paged_step as shared_paged_step

from tacit.kernels.attention_backend import registered_attention_backends
from tacit.layers import attention_selector  # noqa: F401  imports (registers) every attention backend
from tacit.layers.linear import Linear, use_linear_method
from tacit.layers.linear_method import registered_linear_methods

BLOCK_SIZE, NUM_BLOCKS = 4, 48
H, HKV, D = 4, 2, 16  # paged: grouped-query heads
C, R, NOPE, V = 24, 8, 16, 12  # MLA: latent, rope, nope and value dims
# (computed, new) per request; "mixed" holds prefills of very different lengths, which the
# torch backend attends as one flat sequence, and decodes in two context-length buckets.
STEPS = {
    "mixed": [(0, 7), (5, 1), (9, 1), (3, 6), (22, 1), (0, 1), (10, 2), (0, 20)],
    "decode_only": [(5, 1), (0, 1), (14, 1), (3, 1), (30, 1)],
    "prefill_only": [(0, 5), (4, 4), (8, 3)],
}


def paged_step(step: list[tuple[int, int]], seed: int):
    """Shuffled block tables, each token's slot, and each request's positions."""
    return shared_paged_step(step, BLOCK_SIZE, NUM_BLOCKS, seed)[:5]


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    first_pos: int,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [n, H, Dk] at positions first_pos..; k [L, H, Dk], v [L, H, Dv] -> [n, H, Dv], causal;
    with a window each query sees its last `window` positions; sinks [H] join each softmax as
    one more logit that brings no value (gpt-oss's definition)."""
    out = []
    for j in range(q.shape[0]):
        length = first_pos + j + 1
        start = 0 if window is None else max(0, length - window)
        scores = torch.einsum("hd,lhd->hl", q[j].double(), k[start:length].double()) * scale
        if sinks is not None:
            scores = torch.cat([scores, sinks.double()[:, None]], dim=-1)
        probs = scores.softmax(-1)[:, : length - start]
        out.append(torch.einsum("hl,lhd->hd", probs, v[start:length].double()))
    return torch.stack(out)


def run_paged(backend, step, dtype, g, window=None, with_sinks=False):
    num_new, computed, tables, slots, slot_mapping = paged_step(step, 0)
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, HKV, D, dtype=dtype)
    keys = [torch.randn(c + n, HKV, D, generator=g).to(dtype) for c, n in step]
    values = [torch.randn(c + n, HKV, D, generator=g).to(dtype) for c, n in step]
    for i, (c, _) in enumerate(step):  # the context earlier steps wrote
        idx = torch.from_numpy(slots(i, np.arange(c)))
        cache[0].view(-1, HKV, D)[idx] = keys[i][:c]
        cache[1].view(-1, HKV, D)[idx] = values[i][:c]
    query = torch.randn(int(num_new.sum()), H, D, generator=g).to(dtype)
    meta = backend.build_metadata(num_new, computed, tables, slot_mapping, torch.device("cpu"), BLOCK_SIZE)
    backend.write_kv(
        cache,
        torch.cat([k[c:] for k, (c, _) in zip(keys, step)]),
        torch.cat([v[c:] for v, (c, _) in zip(values, step)]),
        meta,
    )
    scale = D**-0.5
    sinks = torch.randn(H, generator=g).to(dtype) * 2 if with_sinks else None
    got = backend.forward(query, cache, meta, scale, sliding_window=window, sinks=sinks)
    refs, start = [], 0
    for i, (c, n) in enumerate(step):
        k = keys[i].float().repeat_interleave(H // HKV, dim=1)
        v = values[i].float().repeat_interleave(H // HKV, dim=1)
        refs.append(reference_attention(query[start : start + n].float(), k, v, c, scale, window, sinks))
        start += n
    return got, torch.cat(refs)


def run_mla(backend, step, dtype, g):
    num_new, computed, tables, slots, slot_mapping = paged_step(step, 1)
    cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, C + R, dtype=dtype)
    latents = [torch.randn(c + n, C, generator=g).to(dtype) for c, n in step]
    k_pes = [torch.randn(c + n, R, generator=g).to(dtype) for c, n in step]
    kv_b = (torch.randn(H * (NOPE + V), C, generator=g) * C**-0.5).to(dtype)
    for i, (c, _) in enumerate(step):
        cache.view(-1, C + R)[torch.from_numpy(slots(i, np.arange(c)))] = torch.cat([latents[i][:c], k_pes[i][:c]], -1)
    query = torch.randn(int(num_new.sum()), H, NOPE + R, generator=g).to(dtype)
    meta = backend.build_metadata(num_new, computed, tables, slot_mapping, torch.device("cpu"), BLOCK_SIZE)
    backend.write_kv(
        cache,
        torch.cat([x[c:] for x, (c, _) in zip(latents, step)]),
        torch.cat([x[c:] for x, (c, _) in zip(k_pes, step)]),
        meta,
    )
    scale = (NOPE + R) ** -0.5
    got = backend.forward(query, cache, meta, scale, kv_b_proj=kv_b)
    refs, start = [], 0
    for i, (c, n) in enumerate(step):
        kv = (latents[i].float() @ kv_b.float().T).view(c + n, H, NOPE + V)
        k = torch.cat([kv[..., :NOPE], k_pes[i].float()[:, None, :].expand(c + n, H, R)], dim=-1)
        refs.append(reference_attention(query[start : start + n].float(), k, kv[..., NOPE:], c, scale))
        start += n
    return got, torch.cat(refs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("name", sorted(registered_attention_backends()))
def test_attention_backend_matches_reference(name, step, dtype):
    cls = registered_attention_backends()[name]
    if not cls.supports("cpu", dtype):
        pytest.skip(f"{name} does not run on cpu in {dtype}")
    g = torch.Generator().manual_seed(7)
    got, ref = (run_mla if cls.use_mla else run_paged)(cls(), STEPS[step], dtype, g)
    assert got.shape == ref.shape and got.dtype == dtype
    # float32: summation order only; bf16: inputs and output rounded to 8 mantissa bits.
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got.double(), ref, rtol=tol, atol=tol), f"max error {(got.double() - ref).abs().max()}"


# Windows shorter than a block, across block edges, and longer than every context (= full).
@pytest.mark.parametrize("window", [1, 3, 6, 64])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("name", sorted(n for n, c in registered_attention_backends().items() if not c.use_mla))
def test_paged_backend_sliding_window_and_sinks(name, step, window, with_sinks):
    cls = registered_attention_backends()[name]
    g = torch.Generator().manual_seed(11)
    got, ref = run_paged(cls(), STEPS[step], torch.float32, g, window=window, with_sinks=with_sinks)
    assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5), f"max error {(got.double() - ref).abs().max()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 40])
@pytest.mark.parametrize("name", sorted(registered_linear_methods()))
@pytest.mark.parametrize("bias", [False, True])
def test_linear_method_matches_reference(name, rows, dtype, bias):
    method = registered_linear_methods()[name].create("cpu", dtype)
    if method is None:
        pytest.skip(f"{name} does not run on this CPU in {dtype}")
    g = torch.Generator().manual_seed(rows)
    layer = Linear(72, 100, bias=bias, dtype=dtype)  # widths off multiples of 16/32: the kernel's tails
    with torch.no_grad():
        layer.weight.copy_(torch.randn(100, 72, generator=g))
        if bias:
            layer.bias.copy_(torch.randn(100, generator=g))
    use_linear_method(layer, method)
    x = torch.randn(rows, 72, generator=g).to(dtype)
    ref = F.linear(x.float(), layer.weight.float(), layer.bias.float() if bias else None)
    got = layer(x)
    assert got.shape == (rows, 100) and got.dtype == dtype
    # float32: summation order only; bf16: accumulated in fp32, rounded to bf16 once or twice (bias).
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    scale = ref.abs().max().item()
    assert (got.float() - ref).abs().max().item() <= tol * scale
