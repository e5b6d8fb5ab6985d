"""Every registered MoEKernel against the plain definition sum_k w_k * down(silu(gate x) * up x),
and the CPU kernel against the torch kernel: the same experts chosen (ties included), outputs
within bf16 rounding, for softmax and grouped-sigmoid routing, 1 to 512 tokens, shared experts
and GGML-quantized experts. gpt-oss's experts (biases, the clamped SwiGLU): every kernel runs
them as the definition says or declines them, and a declined layer runs the torch kernel; the
CPU kernel runs them (bf16 and GGML stacks) as the torch kernel does."""

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F

from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.kernels.ggml_quant import GGMLExpertStack, GGMLTensor, dequantize
from tacit.kernels.moe_kernel import MOE_KERNELS, ExpertActivation, ExpertWeights
from tacit.kernels.moe_routing import MoERouting, route_reference
from tacit.kernels.torch_moe import TorchMoEKernel
from tacit.kernels.weight_quant import quantize_int4_groupwise, quantize_int8_per_channel
from tacit.layers.moe import FusedMoE, select_moe_kernel, use_moe_kernel

needs_cpu_kernels = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)


def dense_reference(x, w13, w2, weights, ids):
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = F.linear(x[t].double(), w13[e].double()).chunk(2)
            out[t] += float(weights[t, k]) * F.linear(F.silu(gate) * up, w2[e].double())
    return out


def swigluoai_reference(x, ew, weights, ids):
    """transformers' GptOssExperts, written out: gate/up with bias, the gate clamped from above
    at 7, up at +-7, (up + 1) * gate * sigmoid(1.702 gate), down with bias."""
    out = torch.zeros(x.shape[0], ew.w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = (F.linear(x[t].double(), ew.w13[e].double()) + ew.w13_bias[e].double()).chunk(2)
            gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
            act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            out[t] += float(weights[t, k]) * (F.linear(act, ew.w2[e].double()) + ew.w2_bias[e].double())
    return out


def random_experts(g, experts, hidden, inter, dtype=torch.float32):
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).to(dtype)
    return ExpertWeights(w13, w2)


def test_kernels_are_registered_and_the_reference_runs_everywhere():
    assert {"torch", "cpu_fused"} <= set(MOE_KERNELS)
    assert isinstance(select_moe_kernel("cpu", torch.float32), TorchMoEKernel)
    assert isinstance(select_moe_kernel("cuda", torch.bfloat16), TorchMoEKernel)


@pytest.mark.parametrize("name", sorted(MOE_KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (7, 8, 2), (33, 16, 4), (5, 4, 4), (40, 4, 2)])
def test_moe_kernel_matches_the_definition(name, dtype, tokens, experts, top_k):
    cls = MOE_KERNELS[name]
    if not cls.supports("cpu", dtype):
        pytest.skip(f"{name} does not run on cpu in {dtype}")
    g = torch.Generator().manual_seed(tokens * 100 + experts)
    hidden, inter = 64, 96
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    ew = random_experts(g, experts, hidden, inter, dtype)
    weights, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(top_k, dim=-1)
    got = cls().experts(x, weights, ids, ew)
    want = dense_reference(x, ew.w13, ew.w2, weights, ids)
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # bf16: a few roundings of values ~1
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", sorted(MOE_KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 9, 40])
def test_moe_kernel_skips_experts_of_another_rank(name, dtype, tokens):
    """Expert parallelism: slots map this rank's experts to rows of its half-size stacks and the
    others to -1; the kernel adds only its own experts' terms (the ranks' sum is the whole)."""
    cls = MOE_KERNELS[name]
    if not cls.supports("cpu", dtype):
        pytest.skip(f"{name} does not run on cpu in {dtype}")
    g = torch.Generator().manual_seed(tokens)
    experts, hidden, inter, top_k = 8, 64, 96, 3
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    full = random_experts(g, experts, hidden, inter, dtype)
    weights, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(top_k, dim=-1)
    for start in (0, experts // 2):
        slots = torch.full((experts,), -1, dtype=torch.int64)
        slots[start : start + experts // 2] = torch.arange(experts // 2)
        mine = slice(start, start + experts // 2)
        part = ExpertWeights(full.w13[mine].contiguous(), full.w2[mine].contiguous(), slots=slots)
        got = cls().experts(x, weights, ids, part)
        local = (ids >= start) & (ids < start + experts // 2)
        want = dense_reference(x, full.w13, full.w2, weights * local, ids)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


ROUTINGS = [
    MoERouting(top_k=8, scoring="softmax", renormalize=True),
    MoERouting(top_k=4, scoring="softmax", renormalize=False),
    MoERouting(top_k=8, scoring="sigmoid", num_groups=8, topk_groups=4, scaling=2.5),
    MoERouting(top_k=6, scoring="sigmoid", num_groups=1, topk_groups=1, renormalize=False),
]


@needs_cpu_kernels
@pytest.mark.parametrize("routing", ROUTINGS, ids=str)
@pytest.mark.parametrize("experts", [64, 128])
def test_cpu_routing_picks_the_reference_experts_ties_included(routing, experts):
    g = torch.Generator().manual_seed(experts)
    # bf16 logits tie often: 1 in 24 rows of 128 experts has a tie at the top-k boundary, which
    # torch.topk breaks by its own selection order, not by index.
    logits = (torch.randn(512, experts, generator=g) * 2).bfloat16().float()
    bias = torch.randn(experts, generator=g) * 0.1
    want_w, want_ids = route_reference(logits, routing, bias)
    got_w, got_ids = MOE_KERNELS["cpu_fused"]().route(logits, routing, bias)
    assert torch.equal(got_ids.sort(-1)[0], want_ids.sort(-1)[0])
    if routing.scoring == "softmax":  # the same order too (sorted=True)
        assert torch.equal(got_ids, want_ids)
    order = [torch.argsort(i, dim=-1) for i in (got_ids, want_ids)]
    torch.testing.assert_close(got_w.gather(1, order[0]), want_w.gather(1, order[1]), rtol=1e-5, atol=1e-6)


def bf16_close(got, want, scale):
    # Both sides round every GEMV output, silu, product and weight to bf16 (2^-9 relative);
    # the torch kernel also rounds after each expert's add. 2^-6 of the output's scale covers
    # the ~8 roundings of a top-8 sum with margin.
    assert (got.float() - want.float()).abs().max().item() <= scale * 2**-6


@needs_cpu_kernels
@pytest.mark.parametrize("tokens", [1, 2, 9, 64, 512])
@pytest.mark.parametrize("shared", [False, True])
def test_cpu_kernel_matches_the_torch_kernel_in_bf16(tokens, shared):
    g = torch.Generator().manual_seed(tokens)
    hidden, inter, experts = 256, 96, 32
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    ew = random_experts(g, experts, hidden, inter, torch.bfloat16)
    sh = random_experts(g, 1, hidden, 2 * inter, torch.bfloat16) if shared else None
    routing = MoERouting(top_k=8, scoring="sigmoid", num_groups=8, topk_groups=4, scaling=2.5)
    logits, bias = torch.randn(tokens, experts, generator=g), torch.randn(experts, generator=g) * 0.1
    fused, ref = MOE_KERNELS["cpu_fused"](), TorchMoEKernel()
    weights, ids = fused.route(logits, routing, bias)
    want = ref.experts(x, weights, ids, ew, sh)
    got = fused.experts(x, weights, ids, ew, sh)
    # 512 tokens x 8 of 32 experts: ~128 slots an expert, past the GEMV tile's 16 (oneDNN path)
    bf16_close(got, want, want.float().abs().max().item())


def quantize_q5_0(w: torch.Tensor) -> GGMLTensor:
    """Q5_0 blocks by the gguf package (llama.cpp's fallback for rows not whole 256-value blocks)."""
    import gguf
    from gguf.quants import quantize

    blocks = quantize(w.float().numpy(), gguf.GGMLQuantizationType.Q5_0)
    return GGMLTensor(torch.from_numpy(blocks), 6, tuple(w.shape))


def quantize_mxfp4(w: torch.Tensor) -> GGMLTensor:
    """MXFP4 blocks by the gguf package (gpt-oss's experts, ggml type 39)."""
    import gguf
    from gguf.quants import quantize

    blocks = quantize(w.float().numpy(), gguf.GGMLQuantizationType.MXFP4)
    return GGMLTensor(torch.from_numpy(blocks), 39, tuple(w.shape))


@needs_cpu_kernels
@pytest.mark.parametrize(
    "quantize",
    [quantize_int8_per_channel, quantize_int4_groupwise, quantize_q5_0, quantize_mxfp4],
    ids=["Q8_0", "Q4_1", "Q5_0", "MXFP4"],
)
@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_cpu_kernel_runs_ggml_experts_as_the_torch_kernel_does(quantize, tokens):
    g = torch.Generator().manual_seed(7)
    hidden, inter, experts = 128, 64, 8
    dense = random_experts(g, experts, hidden, inter)
    blocks = [[quantize(w[e]) for e in range(experts)] for w in (dense.w13, dense.w2)]
    ggml_type = blocks[0][0].ggml_type
    ew = ExpertWeights(
        torch.stack([b.data for b in blocks[0]]), torch.stack([b.data for b in blocks[1]]), ggml_type, ggml_type
    )
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    weights, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(2, dim=-1)
    want = TorchMoEKernel().experts(x, weights, ids, ew)
    kernel = MOE_KERNELS["cpu_fused"]()
    kernel.ggml_int8_activations = False  # the dequantized model's arithmetic, as the torch kernel's
    got = kernel.experts(x, weights, ids, ew)
    bf16_close(got, want, want.float().abs().max().item())
    # and the torch kernel is the definition over the dequantized weights
    deq = [torch.stack([dequantize(b.data, ggml_type, cols) for b in bs]) for bs, cols in zip(blocks, (hidden, inter))]
    ref = dense_reference(x, deq[0].bfloat16(), deq[1].bfloat16(), weights, ids)
    assert (want.double() - ref).abs().max().item() <= ref.abs().max().item() * 2**-5


def test_fused_moe_layer_keeps_ggml_blocks_and_refuses_wrong_ones():
    hidden, inter, experts = 64, 32, 4
    layer = FusedMoE(experts, hidden, inter, MoERouting(top_k=2))
    g = torch.Generator().manual_seed(0)
    dense = random_experts(g, experts, hidden, inter)
    q = {
        "gate_proj": torch.stack([quantize_int8_per_channel(dense.w13[e, :inter]).data for e in range(experts)]),
        "up_proj": torch.stack([quantize_int8_per_channel(dense.w13[e, inter:]).data for e in range(experts)]),
        "down_proj": torch.stack([quantize_int8_per_channel(dense.w2[e]).data for e in range(experts)]),
    }
    layer.use_ggml_stacks(8, 8)

    def stack(blocks, ggml_type, rows, cols):
        return GGMLExpertStack(blocks, ggml_type, (experts, rows, cols))

    with pytest.raises(ValueError, match=r"the config says \(4, 64, 32\), the checkpoint's stack is \(4, 32, 64\)"):
        layer.load_expert_stack("down_proj", stack(q["gate_proj"], 8, inter, hidden))
    for proj, blocks in q.items():
        layer.load_expert_stack(proj, stack(blocks, 8, *((hidden, inter) if proj == "down_proj" else (inter, hidden))))
    layer.check_fully_loaded("mlp.experts")
    assert layer.w13.dtype == torch.uint8 and (layer.w13_type, layer.w2_type) == (8, 8)
    int4 = torch.stack([quantize_int4_groupwise(dense.w13[e, inter:]).data for e in range(experts)])
    with pytest.raises(ValueError, match="up_proj experts are Q4_1; tacit holds them as Q8_0 blocks"):
        layer.load_expert_stack("up_proj", stack(int4, 3, inter, hidden))
    with pytest.raises(ValueError, match="the experts are Q8_0 blocks; got a torch.float32 tensor"):
        layer.load_expert_weight(0, "down_proj", dense.w2[0])
    x = torch.randn(3, hidden, generator=g)
    out = layer(x, torch.randn(3, experts, generator=g))
    assert out.shape == (3, hidden) and torch.isfinite(out).all()


@needs_cpu_kernels
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_bf16_moe_models_run_the_cpu_kernel_and_match_the_torch_kernel(tiny_model_factory, arch):
    from tacit import LLM, SamplingParams
    from tacit.layers.moe import use_moe_kernel

    _, _, path = tiny_model_factory(arch)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12], list(range(20, 45))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    runs = {}
    for kernel in ("cpu_fused", "torch"):
        llm = LLM(str(path), dtype="bfloat16")
        model = llm.engine.runner.model
        layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
        assert layers and all(m.kernel.name == "cpu_fused" for m in layers)
        use_moe_kernel(model, MOE_KERNELS[kernel]())
        runs[kernel] = llm.generate(prompts, params)
    for fused, ref in zip(runs["cpu_fused"], runs["torch"]):
        assert fused.outputs[0].token_ids == ref.outputs[0].token_ids
        got = [next(iter(d.values())).logprob for d in fused.prompt_logprobs[1:]]
        want = [next(iter(d.values())).logprob for d in ref.prompt_logprobs[1:]]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0.02, atol=0.05)


@needs_cpu_kernels
def test_gpt_oss_layers_run_the_cpu_kernel_as_the_torch_kernel_on_the_models_own_inputs(tiny_model_factory):
    """A bf16 gpt-oss: every MoE layer runs the C++ kernel, and on each layer's real hidden states
    and router logits (a 7- and a 31-token prefill: experts past the GEMV tile's 16 slots, then
    decode steps) its output is the torch kernel's within bf16_close's bound."""
    from tacit import LLM, SamplingParams

    _, _, path = tiny_model_factory("gpt_oss")
    llm = LLM(str(path), dtype="bfloat16")
    layers = [m for m in llm.engine.model.modules() if isinstance(m, FusedMoE)]
    assert layers and all(m.kernel.name == "cpu_fused" for m in layers)
    ref, seen = TorchMoEKernel(), []

    def compare(layer, args, out):
        x, logits = args[0], args[1]
        weights, ids = layer.kernel.route(logits.float(), layer.routing)
        want = ref.experts(x, weights, ids, layer.expert_weights())
        got = layer.kernel.experts(x, weights, ids, layer.expert_weights())
        bf16_close(got, want, want.float().abs().max().item())
        seen.append(x.shape[0])

    for m in layers:
        m.register_forward_hook(compare)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    llm.generate([[5, 9, 11, 3, 200, 17, 40], list(range(40, 71))], params)
    assert max(seen) == 38 and min(seen) <= 2  # the batched prefill and the decode steps


def gpt_oss_experts(g, experts, hidden, inter, dtype):
    # Gate/up weights of std 1 over unit inputs: pre-activations of std ~8, so the +-7 clamps bite.
    ew = ExpertWeights(
        torch.randn(experts, 2 * inter, hidden, generator=g).to(dtype),
        (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).to(dtype),
        w13_bias=(torch.randn(experts, 2 * inter, generator=g) * 0.5).to(dtype),
        w2_bias=(torch.randn(experts, hidden, generator=g) * 0.5).to(dtype),
        activation=ExpertActivation("swigluoai"),
    )
    return ew


@pytest.mark.parametrize("name", sorted(MOE_KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (33, 8, 4)])
def test_moe_kernel_runs_gpt_oss_experts_or_declines_them(name, dtype, tokens, experts, top_k):
    cls = MOE_KERNELS[name]
    if not cls.supports("cpu", dtype):
        pytest.skip(f"{name} does not run on cpu in {dtype}")
    g = torch.Generator().manual_seed(tokens)
    hidden, inter = 64, 48
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    ew = gpt_oss_experts(g, experts, hidden, inter, dtype)
    if not cls.supports_experts(ew):
        assert name != "torch", "the reference runs every activation and bias"
        return
    weights, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(top_k, dim=-1)
    got = cls().experts(x, weights, ids, ew)
    want = swigluoai_reference(x, ew, weights, ids)
    gate = torch.einsum("th,eih->tei", x.double(), ew.w13[:, :inter].double())
    assert (gate > 7).any() and (gate.abs() < 7).any()  # both sides of the clamp are exercised
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_swigluoai_is_transformers_gpt_oss_gate():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from tacit.kernels.torch_moe import gate_activation

    gate_up = torch.randn(64, 2 * 48) * 10  # well past the +-7 limit
    hf = GptOssExperts(GptOssConfig(intermediate_size=48, hidden_size=16, num_local_experts=2))
    # transformers interleaves gate and up as even/odd columns; tacit holds them as halves.
    got = gate_activation(gate_up[:, 0::2], gate_up[:, 1::2], ExpertActivation("swigluoai"))
    assert torch.equal(got, hf._apply_gate(gate_up))


def test_a_layer_whose_experts_a_kernel_declines_runs_the_torch_kernel():
    """gpt-oss's biased experts under a kernel that runs only plain SwiGLU (the base class's
    supports_experts): use_moe_kernel leaves that layer on the torch reference, and the others
    on the kernel."""

    class PlainOnly(TorchMoEKernel):
        supports_experts = classmethod(lambda cls, experts: experts.plain_swiglu)

    model = torch.nn.ModuleList(
        [
            FusedMoE(4, 16, 8, MoERouting(top_k=2)),
            FusedMoE(4, 16, 8, MoERouting(top_k=2), activation=ExpertActivation("swigluoai"), has_bias=True),
        ]
    )
    kernel = PlainOnly()
    use_moe_kernel(model, kernel)
    assert model[0].kernel is kernel
    assert type(model[1].kernel) is TorchMoEKernel


@needs_cpu_kernels
def test_the_cpu_kernel_takes_gpt_oss_experts_with_bf16_biases():
    g = torch.Generator().manual_seed(0)
    cls = MOE_KERNELS["cpu_fused"]
    assert cls.supports_experts(gpt_oss_experts(g, 4, 32, 16, torch.bfloat16))
    assert cls.supports_experts(random_experts(g, 4, 32, 16, torch.bfloat16))
    # float32 biases under bf16 activations: declined (the layer runs the torch kernel), not cast per call
    assert not cls.supports_experts(gpt_oss_experts(g, 4, 32, 16, torch.float32))


def gpt_oss_stacks(ew, layout, experts):
    """gpt-oss experts as the CPU kernel takes them: bf16 stacks, GGML blocks (bf16 biases), or
    the upper half held by this expert-parallel rank (slots; biases indexed by slot too)."""
    if layout == "slots":
        half = experts // 2
        slots = torch.full((experts,), -1, dtype=torch.int64)
        slots[half:] = torch.arange(half)
        cut = slice(half, experts)
        return ExpertWeights(
            ew.w13[cut].contiguous(),
            ew.w2[cut].contiguous(),
            slots=slots,
            w13_bias=ew.w13_bias[cut].contiguous(),
            w2_bias=ew.w2_bias[cut].contiguous(),
            activation=ew.activation,
        )
    if layout == "bf16":
        return ew
    quantize = {"Q8_0": quantize_int8_per_channel, "Q5_0": quantize_q5_0}[layout]
    stacks = [torch.stack([quantize(w[e].float()).data for e in range(experts)]) for w in (ew.w13, ew.w2)]
    ggml_type = {"Q8_0": 8, "Q5_0": 6}[layout]
    return ExpertWeights(
        *stacks, ggml_type, ggml_type, w13_bias=ew.w13_bias, w2_bias=ew.w2_bias, activation=ew.activation
    )


@needs_cpu_kernels
@pytest.mark.parametrize("layout", ["bf16", "Q8_0", "Q5_0", "slots"])
@pytest.mark.parametrize("tokens", [1, 2, 9, 64, 512])
def test_cpu_kernel_runs_gpt_oss_experts_as_the_torch_kernel_does(layout, tokens):
    """Biases in both GEMV epilogues, the clamped SwiGLU in phase 1, and (512 tokens x 4 of 8
    experts: ~256 slots an expert, past the GEMV tile's 16) the oneDNN path's own bias and
    activation. The bound is bf16_close's: both kernels round at the same points (F.linear's one
    rounding of x w^T + b, then each of the activation's five bf16 ops), so they differ only
    where fp32 summation order or exp's last bit flips a rounding."""
    g = torch.Generator().manual_seed(tokens)
    hidden, inter, experts = 128, 96, 8
    full = gpt_oss_experts(g, experts, hidden, inter, torch.bfloat16)
    # Down biases of std 8, the size of the experts' outputs (std 0.5 ones moved the result by
    # only ~1.2x the bound below: a dropped bias would have passed by a hair).
    full = dataclasses.replace(full, w2_bias=full.w2_bias * 16)
    ew = gpt_oss_stacks(full, layout, experts)
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    weights, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(4, dim=-1)
    kernel = MOE_KERNELS["cpu_fused"]()
    kernel.ggml_int8_activations = False  # the dequantized model's arithmetic, as the torch kernel's
    got = kernel.experts(x, weights, ids, ew)
    if layout == "slots":
        # The whole stack with the other rank's terms weighted 0: a bias read from the wrong
        # slot (or added for an expert held elsewhere) shows as a difference of the bias's size.
        want = TorchMoEKernel().experts(x, weights * (ids >= experts // 2), ids, full)
    else:
        want = TorchMoEKernel().experts(x, weights, ids, ew)
    bf16_close(got, want, want.float().abs().max().item())


def test_fused_moe_loads_stacks_and_refuses_wrong_ones():
    from tacit.distributed.parallel_state import TensorParallel

    g = torch.Generator().manual_seed(0)
    act = ExpertActivation("swigluoai")
    layer = FusedMoE(4, 16, 8, MoERouting(top_k=2), activation=act, has_bias=True)
    ew = gpt_oss_experts(g, 4, 16, 8, torch.float32)
    for param in ("w13", "w2", "w13_bias"):
        layer.load_stacked(param, getattr(ew, param))
    with pytest.raises(ValueError, match="missing the expert biases w2_bias"):
        layer.check_fully_loaded("mlp.experts")
    with pytest.raises(ValueError, match=r"w2_bias: the config says \(4, 16\), the checkpoint gives \(4, 8\)"):
        layer.load_stacked("w2_bias", torch.zeros(4, 8))
    layer.load_stacked("w2_bias", ew.w2_bias)
    layer.check_fully_loaded("mlp.experts")
    x = torch.randn(5, 16, generator=g)
    weights, ids = torch.softmax(torch.randn(5, 4, generator=g), -1).topk(2, dim=-1)
    want = swigluoai_reference(x, ew, weights, ids)
    got = layer.kernel.experts(x, weights, ids, layer.expert_weights()).double()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    plain = FusedMoE(4, 16, 8, MoERouting(top_k=2))
    with pytest.raises(ValueError, match="expert stack 'w13_bias' is not one of this layer's: w13, w2"):
        plain.load_stacked("w13_bias", ew.w13_bias)
    # Split by feature over two ranks: only rank 0 adds the down bias (the all-reduce sums both).
    rank1 = FusedMoE(4, 16, 8, MoERouting(top_k=2), tp=TensorParallel(1, 2), activation=act, has_bias=True)
    rank1.load_stacked("w2_bias", ew.w2_bias)
    assert not rank1.w2_bias.any()
