"""The int8 KV cache (--kv-cache-dtype int8): its quantization, the torch backends over it, the
C++ decode kernels (paged K/V and MLA's latent rows) against the dequantize-then-attend
reference, and whole models on it."""

import os

import numpy as np
import pytest
import torch
from paged_steps import paged_step

from tacit import LLM, SamplingParams
from tacit.kernels import absorbed_mla_attention as absorbed
from tacit.kernels.absorbed_mla_attention import gather_latent_rows, latent_attention
from tacit.kernels.kv_quant import (
    dequantize,
    gather_paged_int8,
    pack_rows,
    paged_int8_shape,
    paged_int8_views,
    parse_kv_cache_dtype,
    quantize_rows,
    unpack_rows,
    write_paged_int8,
)
from tacit.kernels.torch_attention import build_torch_metadata
from tacit.kernels.torch_mla_attention import MLADims
from tacit.worker.paths.base import finish

needs_kernels = pytest.mark.skipif(bool(os.environ.get("TACIT_NO_CPU_KERNELS")), reason="TACIT_NO_CPU_KERNELS is set")


def kernels():
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    k = load_cpu_kernels()
    if k is None:
        pytest.skip("CPU lacks AVX512-BF16/VNNI or the kernels did not build")
    return k


def test_rows_round_trip_within_half_a_step():
    x = torch.randn(7, 3, 40) * torch.tensor([1e-3, 1.0, 300.0]).view(1, 3, 1)
    q, s = quantize_rows(x)
    assert q.dtype == torch.int8 and s.shape == (7, 3) and q.abs().max() <= 127
    assert torch.allclose(s, x.abs().amax(-1) / 127)
    err = (dequantize(q, s, torch.float32) - x).abs()
    assert (err <= s.unsqueeze(-1) / 2 * (1 + 1e-6)).all()
    assert (q.abs().amax(-1) == 127).all()  # the largest value uses the full range


def test_zero_and_non_finite_rows():
    x = torch.zeros(2, 8)
    x[1, 3] = float("nan")
    q, s = quantize_rows(x)
    back = dequantize(q, s, torch.float32)
    assert torch.equal(back[0], torch.zeros(8)) and s[0] == 0  # no 0/0
    assert back[1].isnan().all()  # a NaN row reads back NaN, as a bf16 cache would hold it


def test_paged_layout_write_and_gather():
    bs, hkv, d, nb = 4, 2, 12, 5
    cache = torch.zeros(paged_int8_shape(nb, bs, hkv, d), dtype=torch.int8)
    assert cache.shape == (2, nb, hkv, bs * (d + 4))
    k, v = torch.randn(nb * bs, hkv, d), torch.randn(nb * bs, hkv, d)
    slots = torch.randperm(nb * bs)
    write_paged_int8(cache, slots, k, v)
    values, scales = paged_int8_views(cache, bs)
    # Head-major runs: slot 9 (block 2, offset 1), head 1's K row sits at run (2, 1), row 1.
    i = int((slots == 9).nonzero())
    qk, sk = quantize_rows(k[i])
    assert torch.equal(values[0, 2, 1, 1], qk[1] ^ -128)  # K stored with its sign bit flipped
    assert scales[0, 2, 1, 1] == sk[1]
    qv, _ = quantize_rows(v[i])
    assert torch.equal(values[1, 2, 1, 1], qv[1])
    tables = torch.tensor([[2, 0], [4, 1]])
    gk, gv = gather_paged_int8(cache, tables, d, torch.float32)
    assert gk.shape == (2, 2 * bs, hkv, d)
    order = torch.empty_like(slots)
    order[slots] = torch.arange(nb * bs)
    for r, blocks in enumerate(tables.tolist()):
        ids = order[torch.tensor([b * bs + o for b in blocks for o in range(bs)])]
        assert torch.equal(gk[r], dequantize(*quantize_rows(k[ids]), torch.float32))
        assert torch.equal(gv[r], dequantize(*quantize_rows(v[ids]), torch.float32))


def test_mla_rows_pack_their_scale():
    x = torch.randn(5, 24)
    packed = pack_rows(x)
    assert packed.shape == (5, 28) and packed.dtype == torch.int8
    assert torch.equal(unpack_rows(packed, torch.float32), dequantize(*quantize_rows(x), torch.float32))


def test_kv_cache_dtype_is_checked():
    assert parse_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert parse_kv_cache_dtype("int8", torch.float32) == torch.int8
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' is not supported; valid: auto, bfloat16"):
        parse_kv_cache_dtype("fp8", torch.bfloat16)
    with pytest.raises(ValueError, match="block_size x head_dim divisible by 4"):
        paged_int8_shape(4, 1, 2, 6)


def test_engine_refuses_an_unknown_kv_cache_dtype(tiny_llama):
    with pytest.raises(ValueError, match="kv_cache_dtype='int4' is not supported"):
        LLM(str(tiny_llama[2]), kv_cache_dtype="int4")


def test_int8_pool_holds_about_twice_the_tokens(tiny_llama):
    budget = 1 << 20
    full = LLM(str(tiny_llama[2]), dtype="float32", kv_cache_memory=budget, kv_cache_dtype="bfloat16").engine
    int8 = LLM(str(tiny_llama[2]), dtype="float32", kv_cache_memory=budget, kv_cache_dtype="int8").engine
    # tiny llama: head_dim 16, so a row is 16 + 4 bytes against bf16's 32.
    assert abs(int8.runner.num_blocks / full.runner.num_blocks - 32 / 20) < 0.01
    cache = int8.model.model.layers[0].self_attn.attn.kv_cache
    assert cache.dtype == torch.int8


# ---- whole models: greedy tokens on peaked tiny models ----


def test_int8_kv_gives_the_same_greedy_tokens(tiny_llama):
    path = str(tiny_llama[2])
    prompts = [[5, 6, 7, 8], list(range(10, 40)), [9] * 17]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ref = LLM(path, dtype="float32", block_size=4).generate(prompts, params)
    got = LLM(path, dtype="float32", block_size=4, kv_cache_dtype="int8").generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]


# The other tiny models' greedy runs reach near-ties (top-2 margins of 0.01-0.1) within 24
# tokens that int8 rounding flips; scored teacher-forced, every position stays close.
@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
def test_int8_kv_scores_stay_close(tiny_model_factory, arch):
    path = str(tiny_model_factory(arch)[2])
    seqs = [list(range(10, 70)), [9, 8, 7] * 20]
    ref = LLM(path, dtype="float32", block_size=4).score_full_logprobs(seqs)
    got = LLM(path, dtype="float32", block_size=4, kv_cache_dtype="int8").score_full_logprobs(seqs)
    for r, g in zip(ref, got):
        kl = (r.exp() * (r - g)).sum(-1)
        assert kl.mean() < 1e-3 and kl.max() < 5e-3  # measured: mean ~1e-4, max ~4e-4
        top2 = r.topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 0.1
        assert torch.equal(r.argmax(-1)[clear], g.argmax(-1)[clear])


@pytest.mark.parametrize("window", [3, 6, 64])
def test_int8_cache_under_a_sliding_window_reads_back_what_it_stored(window):
    """The torch backend over an int8 cache with a sliding window equals it over a float cache
    holding the dequantized rows: the window's block gather reads the quantized layout right.
    Windows shorter than a block of 4, across block edges, and longer than every context."""
    from tacit.kernels.torch_attention import TorchAttentionBackend

    g = torch.Generator().manual_seed(5)
    backend, bs, hkv, heads, d = TorchAttentionBackend(), 4, 2, 4, 16
    step = [(0, 9), (13, 1), (6, 5), (21, 1)]  # (computed, new): prefills, a chunk, decodes
    num_new, computed, tables, _, slot_mapping, nb = paged_step(step, bs, None, 3)
    meta = backend.build_metadata(num_new, computed, tables, slot_mapping, torch.device("cpu"), bs)
    t = int(num_new.sum())
    k, v, q = (
        torch.randn(t, hkv, d, generator=g),
        torch.randn(t, hkv, d, generator=g),
        torch.randn(t, heads, d, generator=g),
    )
    int8 = torch.zeros(paged_int8_shape(nb, bs, hkv, d), dtype=torch.int8)
    plain = torch.zeros(2, nb, bs, hkv, d)
    backend.write_kv(int8, k, v, meta)
    backend.write_kv(plain, unpack_rows(pack_rows(k), torch.float32), unpack_rows(pack_rows(v), torch.float32), meta)
    # Earlier steps' context (the requests' computed tokens): the same rows in both caches.
    for i, (c, _) in enumerate(step):
        if c:
            past_slots = torch.from_numpy(tables[i, np.arange(c) // bs] * bs + np.arange(c) % bs)
            pk, pv = torch.randn(c, hkv, d, generator=g), torch.randn(c, hkv, d, generator=g)
            write_paged_int8(int8, past_slots, pk, pv)
            plain[0].view(-1, hkv, d)[past_slots] = unpack_rows(pack_rows(pk), torch.float32)
            plain[1].view(-1, hkv, d)[past_slots] = unpack_rows(pack_rows(pv), torch.float32)
    got = backend.forward(q, int8, meta, 0.25, sliding_window=window)
    want = backend.forward(q, plain, meta, 0.25, sliding_window=window)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    if window < 22:  # shorter than the longest context: the window changed the result
        assert not torch.allclose(got, backend.forward(q, plain, meta, 0.25), atol=1e-3)


def test_int8_kv_under_sliding_window_layers_stays_close(tiny_model_factory):
    """Gemma 3 (five 32-token sliding layers to one global) on an int8 cache over 60-token
    sequences. The tiny Gemma's norms scale by 1 + w, about 2 (weights drawn around 1 for every
    architecture), so its attention is sharper than the others': even a bf16 cache moves its
    scores by a mean KL of 6e-4, and int8 by 5e-3 (measured; max 4e-2), and int8 flips a few
    top-1 tokens with margins of 0.1-0.5. The exact check of the int8 read under a window is the
    test above."""
    path = str(tiny_model_factory("gemma3")[2])
    seqs = [list(range(10, 70)), [9, 8, 7] * 20]
    ref = LLM(path, dtype="float32", block_size=4).score_full_logprobs(seqs)
    got = LLM(path, dtype="float32", block_size=4, kv_cache_dtype="int8").score_full_logprobs(seqs)
    for r, g in zip(ref, got):
        kl = (r.exp() * (r - g)).sum(-1)
        assert kl.mean() < 1e-2 and kl.max() < 0.1
        top2 = r.topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 0.5
        assert torch.equal(r.argmax(-1)[clear], g.argmax(-1)[clear])


def test_int8_mla_cache_reads_back_what_it_stored(tiny_model_factory):
    """The MLA backend over an int8 latent cache equals it over a float cache holding the
    dequantized latents: the int8 cache changes storage, not the attention. (Whole MoE models
    are not compared token by token: a router near-tie turns a tiny change into another expert.)"""
    import numpy as np

    from tacit.kernels.torch_mla_attention import TorchMLAAttentionBackend

    torch.manual_seed(0)
    backend = TorchMLAAttentionBackend()
    bs, nb, rank, rope, heads, nope, vdim = 4, 6, 32, 8, 4, 16, 16
    n = 11
    meta = backend.build_metadata(
        np.array([n]),
        np.array([0]),
        np.array([[3, 0, 5]]),
        np.array([3 * bs + i if i < bs else (0 if i < 2 * bs else 5) * bs + i % bs for i in range(n)]),
        torch.device("cpu"),
        bs,
    )
    latent, k_pe = torch.randn(n, rank), torch.randn(n, rope) * 3
    q = torch.randn(n, heads, nope + rope)
    kv_b = torch.randn(heads * (nope + vdim), rank) * 0.1
    int8 = torch.zeros(nb, bs, rank + rope + 8, dtype=torch.int8)
    backend.write_kv(int8, latent, k_pe, meta)
    plain = torch.zeros(nb, bs, rank + rope)
    backend.write_kv(
        plain, unpack_rows(pack_rows(latent), torch.float32), unpack_rows(pack_rows(k_pe), torch.float32), meta
    )
    got = backend.forward(q, int8, meta, 0.2, kv_b_proj=kv_b)
    want = backend.forward(q, plain, meta, 0.2, kv_b_proj=kv_b)
    assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_moe", "gpt_oss"])
def test_int8_kv_runs_moe_and_mla_models(tiny_model_factory, arch):
    path = str(tiny_model_factory(arch)[2])
    seqs = [list(range(10, 70))]
    ref = LLM(path, dtype="float32", block_size=4).score_full_logprobs(seqs)[0]
    got = LLM(path, dtype="float32", block_size=4, kv_cache_dtype="int8").score_full_logprobs(seqs)[0]
    kl = (ref.exp() * (ref - got)).sum(-1)
    # Most positions as close as the dense models; a few jump where a router near-tie flips.
    assert kl.median() < 1e-3


def test_int8_kv_survives_swap_preemption(tiny_llama):
    path = str(tiny_llama[2])
    prompts = [[7 + i] * 30 for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM(path, dtype="float32", kv_cache_dtype="int8").generate(prompts, params)]
    llm = LLM(path, dtype="float32", num_kv_blocks=16, block_size=8, preemption_mode="swap", kv_cache_dtype="int8")
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    s = llm.engine.scheduler
    assert s.num_preemptions > 0 and s.swapper.num_swapped_out > 0
    assert out == ref


# ---- the C++ kernels ----


def reference_attention(q, k, v, scale):
    """q [H, D], k/v [L, Hkv, D] float -> [H, D]."""
    g = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    p = (torch.einsum("hd,nhd->hn", q, k) * scale).softmax(-1)
    return torch.einsum("hn,nhd->hd", p, v)


def kernel_query(q: torch.Tensor) -> torch.Tensor:
    """The query as the kernel scores it: each head rounded to int8 with scale max|q| / 127."""
    qq, s = quantize_rows(q.float())
    return dequantize(qq, s, torch.float32)


@needs_kernels
@pytest.mark.parametrize(
    "d, heads, kv_heads, bs, ctx",
    [(64, 9, 3, 16, 300), (64, 4, 4, 16, 16), (24, 4, 2, 8, 50), (128, 8, 2, 16, 129), (80, 6, 3, 4, 71)],
)
def test_decode_kernel_matches_dequantize_then_attend(d, heads, kv_heads, bs, ctx):
    k8 = kernels()
    torch.manual_seed(d + ctx)
    nb, m = 64, 3
    cache = torch.zeros(paged_int8_shape(nb, bs, kv_heads, d), dtype=torch.int8)
    write_paged_int8(cache, torch.arange(nb * bs), torch.randn(nb * bs, kv_heads, d), torch.randn(nb * bs, kv_heads, d))
    q = torch.randn(m, heads, d).bfloat16()
    pos = torch.tensor([ctx - 1, ctx // 2, 0])
    tables = torch.stack([torch.randperm(nb)[: -(-ctx // bs)] for _ in range(m)])
    scale = d**-0.5
    got = k8.paged_decode_attention(q, cache, pos, tables, scale).float()
    keys, values = gather_paged_int8(cache, tables, d, torch.float32)
    for r in range(m):
        n = int(pos[r]) + 1
        exact = reference_attention(kernel_query(q[r]), keys[r, :n], values[r, :n], scale)
        # fp32 arithmetic, int16 probabilities (<= 1/65534 of the largest) and bf16 output rounding.
        assert (got[r] - exact).abs().max() <= 4e-3 * exact.abs().max() + 2e-3
        plain = reference_attention(q[r].float(), keys[r, :n], values[r, :n], scale)
        assert (got[r] - plain).abs().max() <= 0.05 * plain.abs().max()  # the query's own int8 rounding


@needs_kernels
def test_kernel_quantizer_is_bit_for_bit_the_torch_one():
    k8 = kernels()
    x = (torch.randn(300, 40) * torch.logspace(-3, 3, 300).unsqueeze(-1)).bfloat16()
    x[7] = 0
    x[11, 5] = float("nan")
    values, scales = k8.kv_quantize_rows(x, False)
    ref_values, ref_scales = quantize_rows(x)
    assert torch.equal(values, ref_values)
    assert torch.equal(scales.nan_to_num(-1), ref_scales.nan_to_num(-1))
    flipped, _ = k8.kv_quantize_rows(x, True)  # K's storage
    assert torch.equal(flipped, ref_values ^ -128)


@needs_kernels
@pytest.mark.parametrize("arch", ["llama", "qwen3", "deepseek_v3_qlora"])
def test_fused_decoder_on_int8_kv_matches_the_torch_path(tiny_model_factory, arch):
    from tests.kernels.test_fused_decode import step_both_ways

    kernels()
    path = str(tiny_model_factory(arch)[2])
    engine = LLM(path, dtype="bfloat16", block_size=4, kv_cache_dtype="int8").engine
    assert engine.runner.fused_decode is not None, "the fused decoder takes an int8 KV cache"
    for i, p in enumerate([[5, 6, 7], list(range(10, 31)), [40] * 9, [8]]):
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), request_id=str(i))
    # The kernel also rounds each query head to int8 (the torch path attends with the bf16
    # query): measured up to 2.0% of the largest logit here, against bf16's 1.1%.
    assert step_both_ways(engine, tolerance=0.04) == 11


# ---- MLA's int8 latent cache: csrc's mla_decode_attention reads it in place ----


def int8_latent_step(rank: int, rope: int, heads: int, bs: int, contexts: list[int], seed: int):
    """A decode step over an int8 latent cache (shuffled blocks, every request's context written
    as MLAWriteKV writes it): (cache, positions [R], block tables [R, B], the step's torch
    metadata, bf16 queries [R, H, rank + rope])."""
    g = torch.Generator().manual_seed(seed)
    step = [(c - 1, 1) for c in contexts]  # the query is each context's last token
    num_new, computed, tables, slots, slot_mapping, num_blocks = paged_step(step, bs, None, seed)
    cache = torch.zeros(num_blocks, bs, rank + rope + 8, dtype=torch.int8)
    for i, c in enumerate(contexts):
        latent, k_pe = torch.randn(c, rank, generator=g), torch.randn(c, rope, generator=g) * 2
        rows = torch.cat([pack_rows(latent), pack_rows(k_pe)], dim=-1)
        cache.view(-1, cache.shape[-1])[torch.from_numpy(slots(i, np.arange(c)))] = rows
    meta = build_torch_metadata(num_new, computed, tables, slot_mapping, torch.device("cpu"), bs)
    q = torch.randn(len(contexts), heads, rank + rope, generator=g).bfloat16()
    return cache, torch.from_numpy(computed), torch.from_numpy(tables), meta, q


def torch_latent_decode(q, cache, meta, rank, rope, scale):
    """The absorbed backend's torch path on the same cache, group by group (decodes go in
    context-length buckets): dequantize, then attend in float32 -> [R, H, rank]."""
    dims = MLADims(heads=q.shape[1], rank=rank, rope=rope, nope=0, v=0)
    out = torch.empty(q.shape[0], q.shape[1], rank)
    for g in meta.groups:
        assert g.decode_only
        index = slice(None) if g.token_index is None else g.token_index
        ctx = gather_latent_rows(cache, g, dims)
        out[index] = latent_attention(q[index].float().unsqueeze(1), ctx, g.attn_mask[:, 0], scale, rank).squeeze(1)
    return out


def mla_kernel_query(q: torch.Tensor, rank: int) -> torch.Tensor:
    """The query as the kernel scores it: each head's latent and rope parts rounded to int8 apart."""
    return torch.cat([kernel_query(q[..., :rank]), kernel_query(q[..., rank:])], dim=-1)


@needs_kernels
@pytest.mark.parametrize(
    "rank, rope, heads, bs, contexts",
    [
        (32, 8, 16, 4, [1, 5, 9, 70]),  # the tiny DeepSeek-V3's widths, 4-token blocks
        (48, 8, 1, 16, [300, 17, 1, 16]),  # masked tails in every loop, one head
        (512, 64, 16, 16, [1000, 33, 257]),  # DeepSeek-V3 (random:deepseek-v3-1b's 16 heads)
        (512, 64, 1, 16, [129, 4]),
        (512, 64, 128, 16, [61, 2]),  # V3's 128 heads: every score and PV head block
    ],
)
def test_mla_int8_kernel_matches_gather_then_attend(rank, rope, heads, bs, contexts):
    k8 = kernels()
    cache, positions, tables, meta, q = int8_latent_step(rank, rope, heads, bs, contexts, seed=rank + heads)
    scale = 0.3 * (rank + rope) ** -0.5
    got = k8.mla_decode_attention(q, cache, positions, tables, scale, rank)  # every request in one call
    assert got.shape == (len(contexts), heads, rank) and got.dtype == torch.bfloat16
    got = got.float()
    exact = torch_latent_decode(mla_kernel_query(q, rank), cache, meta, rank, rope, scale)
    plain = torch_latent_decode(q, cache, meta, rank, rope, scale)
    for r in range(len(contexts)):
        # Given the kernel's int8 query, what is left is the int16 weights (<= 1/65534 of the
        # largest each), fp32 summation order and the bf16 output (2^-9 relative): measured
        # <= 0.25% of the largest output.
        assert (got[r] - exact[r]).abs().max() <= 4e-3 * exact[r].abs().max() + 1e-3
        # The query's own int8 rounding (step max|q| / 127 per part) moves scores by ~0.4% of
        # max|q| * |k|: measured <= 0.9% of the largest output.
        assert (got[r] - plain[r]).abs().max() <= 0.05 * plain[r].abs().max()


@needs_kernels
def test_mla_int8_kernel_takes_nan_and_threads_as_torch_does():
    k8 = kernels()
    rank, rope = 64, 16
    cache, positions, tables, _, q = int8_latent_step(rank, rope, 16, 16, [200, 40], seed=3)
    args = (positions, tables, 0.1, rank)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):  # two threads split one request's heads; the result must not move
            torch.set_num_threads(n)
            outs.append(k8.mla_decode_attention(q, cache, *args))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])
    first = int(tables[0, 0]) * 16  # request 0's first row: a NaN scale
    cache.view(-1, cache.shape[-1])[first, rank : rank + 4] = torch.tensor([float("nan")]).view(torch.int8)
    out = k8.mla_decode_attention(q, cache, *args)
    assert out[0].isnan().all() and out[1].isfinite().all()  # as torch's softmax over a NaN score


@needs_kernels
def test_mla_decode_attention_rejects_bad_input():
    k8 = kernels()
    rank, rope = 32, 8
    cache, positions, tables, _, q = int8_latent_step(rank, rope, 4, 4, [9], seed=0)
    args = (positions, tables, 0.1, rank)
    with pytest.raises(RuntimeError, match=r"int8 latent cache row is the latent \(v_dim\) and rope .* 48 bytes"):
        k8.mla_decode_attention(q, cache[..., :-4].contiguous(), *args)  # one scale short
    with pytest.raises(RuntimeError, match="latent_cache: contiguous .* bf16 or int8, got Float"):
        k8.mla_decode_attention(q, cache.float(), *args)
    with pytest.raises(RuntimeError, match="latent_cache: contiguous"):
        k8.mla_decode_attention(q, cache.transpose(0, 1), *args)
    with pytest.raises(RuntimeError, match=r"q: contiguous \[m, H, D\] bf16"):
        k8.mla_decode_attention(q.float(), cache, *args)
    with pytest.raises(RuntimeError, match="v_dim must be within the row"):
        k8.mla_decode_attention(q, cache, positions, tables, 0.1, rank + rope + 1)
    with pytest.raises(RuntimeError, match="int8 latent cache row"):  # an int8 row needs a rope part
        k8.mla_decode_attention(q, cache, positions, tables, 0.1, rank + rope)


@needs_kernels
def test_tiny_deepseek_on_int8_latents_runs_the_kernel_and_keeps_its_tokens(tiny_model_factory, monkeypatch):
    """bf16 DeepSeek-V3 with an int8 latent cache: every decode of the absorbed backend goes to
    csrc's int8 kernel, each call matches the torch path (gather_latent_rows, then
    latent_attention) on the same cache and queries, and each step's greedy tokens match the
    torch path's on the same cache wherever the choice is clear.

    Whole generations are not compared token by token: this random tiny model's top-2 logits
    come within 0.016 of each other in its first tokens, and a router near-tie turns a 1% change
    into another expert (a 1.1 logit jump in one row of 45 here; the bf16 kernel against the
    bf16 torch path shows the same, 1.9 in its fifth step), where generations part ways."""
    kernels()
    real, use_kernel, errors = absorbed.decode_kernel, [True], []

    class Checking:
        """The kernels, with each latent decode checked against the torch path."""

        def __init__(self, module, group):
            self.module, self.group = module, group

        def mla_decode_attention(self, q, cache, positions, tables, scale, rank):
            got = self.module.mla_decode_attention(q, cache, positions, tables, scale, rank).float()
            dims = MLADims(heads=q.shape[1], rank=rank, rope=q.shape[2] - rank, nope=0, v=0)
            ctx = gather_latent_rows(cache, self.group, dims)
            want = latent_attention(q.float().unsqueeze(1), ctx, self.group.attn_mask[:, 0], scale, rank).squeeze(1)
            assert cache.dtype == torch.int8
            errors.append(((got - want).abs().max() / want.abs().max()).item())
            return got.to(q.dtype)

    def switched(q, kv_cache, group):
        module = real(q, kv_cache, group) if use_kernel[0] else None
        return None if module is None else Checking(module, group)

    monkeypatch.setattr(absorbed, "decode_kernel", switched)
    path = str(tiny_model_factory("deepseek_v3")[2])
    engine = LLM(path, dtype="bfloat16", block_size=4, kv_cache_dtype="int8").engine
    # The torch path's decodes (the fused C++ step calls the same kernel: the fused-decoder test above).
    engine.runner.fused_decode = None
    for i, p in enumerate([[5, 6, 7, 8], list(range(10, 40)), [9] * 17]):
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), request_id=str(i))
    runner, steps, rows_close = engine.runner, 0, []
    real_forward = runner.forward_steps

    def compute(rows):
        return tuple(finish(real_forward(rows, False)))[:3]

    def both_ways(rows, pausable):
        nonlocal steps
        before = len(errors)
        result = yield from real_forward(rows, pausable)
        samples, got, scores = result[:3]
        if len(errors) > before:  # the kernel ran: the torch path on the same cache and rows
            use_kernel[0] = False
            try:
                ref_samples, ref, _ = compute(rows)  # rewrites this step's latents, the same values
            finally:
                use_kernel[0] = True
            assert samples == ref_samples
            got_f, ref_f = got.float(), ref.float()
            scale = ref_f.abs().max().item()
            rows_close.extend(((got_f - ref_f).abs().amax(-1) < 0.04 * scale).tolist())
            top2 = ref_f.topk(2, dim=-1).values
            clear = (top2[:, 0] - top2[:, 1]) > 0.05 * scale
            assert torch.equal(got_f.argmax(-1)[clear], ref_f.argmax(-1)[clear]), f"step {steps}: another token"
            steps += 1
        return result

    runner.forward_steps = both_ways
    while engine.has_unfinished_requests():
        engine.step()
    # 15 decode steps after the prefill, each through the kernel in all 3 layers (once per
    # context-length bucket of decodes).
    assert steps == 15 and len(errors) >= 45, "the int8 latent decode kernel did not run every decode"
    # Mostly the query's int8 rounding (test_mla_int8_kernel_matches_gather_then_attend): measured
    # <= 1.0% of the largest weighted latent.
    assert max(errors) < 0.05
    # Logits within 4% of the largest (measured 0.7-2.5%) but where a router flips (see above).
    assert sum(rows_close) >= 0.9 * len(rows_close)
