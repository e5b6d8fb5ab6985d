"""The absorbed MLA backend against the naive (reference) path on the same caches and queries.

Both paths compute the same attention in a different order (kv_b_proj applied to the context
and the output, or absorbed into the query and the output), so in float32 they agree to
summation order. Widths are off the tiny models' so a wrong split of kv_b_proj shows.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
import torch
from paged_steps import paged_step

from tacit import LLM, SamplingParams
from tacit.kernels import absorbed_mla_attention as absorbed
from tacit.kernels.absorbed_mla_attention import (
    AbsorbedMLAAttentionBackend,
    absorbed_weights,
    decode_kernel,
    mla_costs,
    prefers_absorbed,
)
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.kv_quant import pack_rows
from tacit.kernels.torch_mla_attention import MLADims, TorchMLAAttentionBackend

HEADS, RANK, ROPE, NOPE, VDIM = 4, 48, 8, 24, 20
BLOCK_SIZE = 16
V3 = MLADims(heads=128, rank=512, rope=64, nope=128, v=128)

# (computed, new) per request.
DECODE = [(c, 1) for c in (0, 1, 5, 15, 16, 40, 99, 160, 255, 299)]  # contexts 1..300 tokens
MIXED = [(0, 9), (30, 1), (0, 1), (17, 5), (250, 1), (64, 40), (3, 2), (120, 1)]


def make_step(step: list[tuple[int, int]], cache_dtype: torch.dtype, seed: int):
    """A cache holding every request's context (shuffled blocks), this step's rows written by
    the backend, and random queries and kv_b_proj."""
    g = torch.Generator().manual_seed(seed)
    num_new, computed, tables, slots, slot_mapping, num_blocks = paged_step(step, BLOCK_SIZE, None, seed)
    width = RANK + ROPE + (8 if cache_dtype == torch.int8 else 0)
    cache = torch.zeros(num_blocks, BLOCK_SIZE, width, dtype=cache_dtype)
    latents = [torch.randn(c + n, RANK, generator=g) for c, n in step]
    k_pes = [torch.randn(c + n, ROPE, generator=g) * 2 for c, n in step]
    for i, (c, _) in enumerate(step):
        lat, pe = latents[i][:c], k_pes[i][:c]
        rows = torch.cat([pack_rows(lat), pack_rows(pe)], -1) if cache_dtype == torch.int8 else torch.cat([lat, pe], -1)
        cache.view(-1, width)[torch.from_numpy(slots(i, np.arange(c)))] = rows.to(cache_dtype)
    query = torch.randn(int(num_new.sum()), HEADS, NOPE + ROPE, generator=g)
    kv_b = torch.randn(HEADS * (NOPE + VDIM), RANK, generator=g) * RANK**-0.5
    new_latent = torch.cat([x[c:] for x, (c, _) in zip(latents, step)])
    new_pe = torch.cat([x[c:] for x, (c, _) in zip(k_pes, step)])
    return (num_new, computed, tables, slot_mapping), cache, query, kv_b, new_latent, new_pe


def run(backend, step, cache_dtype, dtype=torch.float32, seed=0):
    (num_new, computed, tables, slot_mapping), cache, query, kv_b, latent, k_pe = make_step(step, cache_dtype, seed)
    meta = backend.build_metadata(num_new, computed, tables, slot_mapping, torch.device("cpu"), BLOCK_SIZE)
    backend.write_kv(cache, latent, k_pe, meta)
    scale = (NOPE + ROPE) ** -0.5
    return backend.forward(query.to(dtype), cache, meta, scale, kv_b_proj=kv_b.to(dtype))


@pytest.fixture
def always_absorbed(monkeypatch):
    """Every group through the absorbed path, whatever the cost model would pick."""
    calls = []

    def take(*args):
        calls.append(args)
        return True

    monkeypatch.setattr(absorbed, "prefers_absorbed", take)
    return calls


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.int8])
@pytest.mark.parametrize("step", [DECODE, MIXED], ids=["decode", "mixed"])
def test_absorbed_matches_naive(always_absorbed, step, cache_dtype):
    got = run(AbsorbedMLAAttentionBackend(), step, cache_dtype)
    want = run(TorchMLAAttentionBackend(), step, cache_dtype)
    assert always_absorbed, "the absorbed path never ran"
    assert got.shape == (sum(n for _, n in step), HEADS, VDIM)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_absorbed_bf16_close_to_float32(always_absorbed):
    """bf16 inputs and weights; scores, softmax and weighted latents in float32 (as in float32
    itself), so the error is the inputs' and projections' bf16 rounding."""
    want = run(TorchMLAAttentionBackend(), MIXED, torch.float32)
    got = run(AbsorbedMLAAttentionBackend(), MIXED, torch.bfloat16, dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


def test_score_slices_match_one_block(always_absorbed, monkeypatch):
    """Slicing the score block by requests and by queries leaves the result unchanged."""
    want = run(AbsorbedMLAAttentionBackend(), MIXED, torch.float32)
    for limit in (HEADS * 400, HEADS * 300 * 3, 1):  # by queries (the flat prefill group), by requests
        monkeypatch.setattr(absorbed, "SCORE_BLOCK_ELEMENTS", limit)
        torch.testing.assert_close(run(AbsorbedMLAAttentionBackend(), MIXED, torch.float32), want, rtol=0, atol=1e-6)


def test_cost_picks_absorbed_for_decode_and_naive_for_fresh_prefill():
    # One key: both project one row, naive attends narrower (320 against 1,088): a near tie.
    assert not prefers_absorbed(1, 1, 1, 1, V3)
    for context in (2, 16, 4096, 65536):
        assert prefers_absorbed(1, 1, 1, context, V3)
        assert prefers_absorbed(64, 64, 1, context, V3)  # a batch of decodes
    assert not prefers_absorbed(2048, 1, 2048, 2048, V3)  # a fresh prompt
    assert not prefers_absorbed(256, 1, 256, 256, V3)
    assert prefers_absorbed(64, 1, 64, 4096 + 64, V3)  # a short chunk after a long context
    naive, absorbed_cost = mla_costs(1, 1, 1, 4096, V3)
    assert naive == 128 * (4096 * 512 * 256 + 4096 * 320) and absorbed_cost == 128 * (512 * 256 + 4096 * 1088)


def test_split_weights_cached_and_refreshed():
    dims = MLADims(heads=HEADS, rank=RANK, rope=ROPE, nope=NOPE, v=VDIM)
    w = torch.randn(HEADS * (NOPE + VDIM), RANK)
    uk, uv_t = absorbed_weights(w, dims)
    assert absorbed_weights(w, dims)[0] is uk  # split once, not per call
    per_head = w.view(HEADS, NOPE + VDIM, RANK)
    assert torch.equal(uk, per_head[:, :NOPE]) and torch.equal(uv_t, per_head[:, NOPE:].transpose(1, 2))
    with torch.no_grad():
        w.mul_(2)  # an in-place reload
    uk2, _ = absorbed_weights(w, dims)
    assert torch.equal(uk2, 2 * uk)
    other = w.clone()
    assert absorbed_weights(other, dims)[0] is not uk2
    key = id(other)
    del other
    gc.collect()
    assert key not in absorbed._SPLITS  # a freed weight's split goes with it
    with torch.inference_mode():  # such tensors have no version counter
        frozen = torch.randn(HEADS * (NOPE + VDIM), RANK)
    assert torch.equal(absorbed_weights(frozen, dims)[0], frozen.view(HEADS, NOPE + VDIM, RANK)[:, :NOPE])


def test_tiny_deepseek_selects_absorbed_and_takes_both_paths(tiny_model_factory, monkeypatch):
    """The parity tests (tests/models/test_transformers_parity.py) run this backend: it is the
    one selected, and its decodes go absorbed while a fresh 300-token prompt goes naive."""
    taken = []
    for name in ("absorbed_attend", "naive_attend"):
        real = getattr(absorbed, name)
        monkeypatch.setattr(absorbed, name, lambda *a, real=real, name=name: taken.append(name) or real(*a))
    path = str(tiny_model_factory("deepseek_v3")[2])
    llm = LLM(path, dtype="float32")
    assert isinstance(llm.engine.runner.attn_backend, AbsorbedMLAAttentionBackend)
    llm.generate([list(range(3, 303))], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert "absorbed_attend" in taken and "naive_attend" in taken


@pytest.mark.skipif(load_cpu_kernels() is None, reason="needs the AVX512-BF16 CPU kernels")
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.int8])
@pytest.mark.parametrize("step", [DECODE, [(299, 1)], MIXED], ids=["decode", "one_row", "mixed"])
def test_latent_decode_kernel_matches_torch_absorbed(always_absorbed, monkeypatch, step, cache_dtype):
    """csrc's in-place latent decode against the torch absorbed path, bf16 queries on a bf16 or
    int8 cache. Widths 48 + 8 leave masked tails in every loop; one row alone splits its heads
    across threads."""
    used = []
    monkeypatch.setattr(absorbed, "decode_kernel", lambda *a: used.append(decode_kernel(*a)) or used[-1])
    got = run(AbsorbedMLAAttentionBackend(), step, cache_dtype, dtype=torch.bfloat16)
    assert any(k is not None for k in used), "the kernel never ran"
    monkeypatch.setattr(absorbed, "decode_kernel", lambda *a: None)
    want = run(AbsorbedMLAAttentionBackend(), step, cache_dtype, dtype=torch.bfloat16)
    # Both read the same rows and score in fp32; the kernel rounds probabilities to bf16 (int8
    # cache: to 15-bit fixed point, and each query to int8) before weighting the latents, the
    # torch path keeps fp32.
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(load_cpu_kernels() is None, reason="needs the AVX512-BF16 CPU kernels")
def test_head_bmm_projections_match_torch_bmm(always_absorbed, monkeypatch):
    """With a rank and v that csrc/head_bmm.cpp takes (multiples of 32), a bf16 decode's two
    per-head projections run there instead of torch.bmm: the same outputs up to bf16 rounding
    (both sum bf16 products in fp32 and round once)."""
    monkeypatch.setattr(sys.modules[__name__], "RANK", 64)
    monkeypatch.setattr(sys.modules[__name__], "VDIM", 32)
    fits = []
    real = absorbed.head_bmm_fits
    monkeypatch.setattr(absorbed, "head_bmm_fits", lambda *w: fits.append(real(*w)) or fits[-1])
    got = run(AbsorbedMLAAttentionBackend(), DECODE, torch.bfloat16, dtype=torch.bfloat16)
    assert fits and all(fits), "head_bmm never ran"
    monkeypatch.setattr(absorbed, "head_bmm_fits", lambda *w: False)
    want = run(AbsorbedMLAAttentionBackend(), DECODE, torch.bfloat16, dtype=torch.bfloat16)
    assert got.shape == want.shape == (len(DECODE), HEADS, 32)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)
