"""The fused C++ decode step against the torch path it replaces, on the same KV cache."""

import os

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.worker.paths.base import finish
from tacit.worker.paths.fused_binders import build_fused_decoder, fused_decoder_unsupported_reason
from tacit.worker.paths.fused_decode import FusedDecodePath
from tacit.worker.paths.split import SplitPath
from tacit.worker.request_state import update_request_states

pytestmark = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)


def both_paths(runner, rows, compute=None):
    """Logits of one step's rows from the fused decoder, then from the torch path."""
    compute = compute or runner.compute_logits
    fused = runner.fused_decode
    samples, got, _ = compute(rows)
    runner.fused_decode = None
    try:
        ref_samples, ref, _ = compute(rows)  # rewrites this step's KV slots with torch's values
    finally:
        runner.fused_decode = fused
    assert samples == ref_samples
    return got.float(), ref.float()


def step_both_ways(engine, tolerance: float = 0.02) -> int:
    """Run the engine to the end, checking every fused step against the torch path; returns how
    many. tolerance: the largest logit difference allowed, as a fraction of the largest logit."""
    runner, checked = engine.runner, 0
    real = runner.forward_steps

    def checking(rows, pausable):
        nonlocal checked
        if isinstance(runner.path_for(rows), FusedDecodePath):
            got, ref = both_paths(runner, rows, lambda r: tuple(finish(real(r, False)))[:3])
            # bf16 through two layers: ~1 ulp per op of drift from fp32 summation order, at most
            # ~1.1% of the largest logit here; leaving out the 0.05-std qkv bias moves them ~5%.
            scale = ref.abs().max().item()
            assert (got - ref).abs().max().item() < tolerance * scale, f"fused step {checked}: logits diverge"
            top2 = ref.topk(2, dim=-1).values
            clear = (top2[:, 0] - top2[:, 1]) > 0.05 * scale
            assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])
            checked += 1
        # Then the step itself (on the fused path when it applies): its tokens feed both next step.
        return (yield from real(rows, pausable))

    runner.forward_steps = checking
    try:
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        del runner.forward_steps
    return checked


def scheduled_rows(engine):
    """Schedule one step and hand its rows to the runner's state, without running it."""
    sched = engine.scheduler.schedule()
    update_request_states(engine.runner.requests, sched)
    return engine.runner.rows(sched)


# llama: plain; llama3: tied embeddings, o_proj bias, llama3 rope; qwen2: qkv bias; qwen3: q/k
# norm; qwen2_odd: widths off multiples of 16/32. Rows 1-8: the GEMV kernel; 9-32: oneDNN mm;
# 33+: F.linear with the bias inside.
@pytest.mark.parametrize(
    "arch, rows",
    [
        ("llama", 1),
        ("llama", 4),
        ("llama", 14),
        ("llama3", 4),
        ("llama3", 14),
        ("qwen2", 7),
        ("qwen2", 40),
        ("qwen3", 4),
        ("qwen3", 14),
        ("qwen2_odd", 3),
        ("qwen2_odd", 40),
        ("qwen3_moe", 1),
        ("qwen3_moe", 9),
        ("qwen3_moe_nonorm", 4),
        ("deepseek_v3", 1),
        ("deepseek_v3", 9),
        ("deepseek_v3_qlora", 4),
        ("deepseek_v3_wide", 3),
    ],
)
def test_fused_decode_matches_torch_path(tiny_model_factory, arch, rows):
    _, _, path = tiny_model_factory(arch)
    engine = LLM(str(path), dtype="bfloat16", block_size=4).engine
    assert engine.runner.fused_decode is not None, "a dense Llama-family bf16 model should get the fused decoder"
    # Different lengths, so rows cross block boundaries at different steps (block_size 4).
    prompts = [[5, 6, 7], list(range(10, 31)), [40] * 9, list(range(50, 63)), [8], list(range(70, 140)), [9, 9]]
    prompts += [[11 + i % 50] * (i % 23 + 2) for i in range(rows)]
    max_tokens = 24 if rows <= 14 else 6
    for p in prompts[:rows]:
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    assert step_both_ways(engine) == max_tokens - 1  # one prefill step, then the decode steps


def test_the_comparison_catches_a_missing_bias(tiny_model_factory):
    """Negative control: a fused decoder bound without the qkv bias must fail the check above."""
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    _, _, path = tiny_model_factory("qwen2")
    engine = LLM(str(path), dtype="bfloat16", block_size=4).engine
    attns = [layer.self_attn.qkv_proj for layer in engine.model.model.layers]
    biases = [a.bias for a in attns]
    for a in attns:
        a.bias = torch.nn.Parameter(torch.zeros_like(a.bias))
    try:
        engine.runner.fused_decode = build_fused_decoder(engine.model, load_cpu_kernels(), 4, engine.max_model_len)
    finally:
        for a, b in zip(attns, biases):
            a.bias = b
    for i in range(4):
        engine.add_request([5 + i] * (i + 1), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    with pytest.raises(AssertionError, match="logits diverge"):
        step_both_ways(engine)


def test_one_token_prefill_chunk_rides_the_fused_step_without_sampling(tiny_model_factory):
    _, _, path = tiny_model_factory("llama")
    engine = LLM(str(path), dtype="bfloat16", max_num_batched_tokens=2).engine
    # A 2-token budget: the 4-token prompt is fed one token a step beside the other's decodes.
    engine.add_request([5], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), request_id="short")
    engine.add_request([6, 7, 8, 9], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), request_id="long")
    assert step_both_ways(engine) == 6


def test_models_the_fused_decoder_does_not_run_keep_the_torch_path(tiny_model_factory):
    for arch in ("deepseek_v3", "llama"):  # float32: the fused step is bf16 only
        _, _, path = tiny_model_factory(arch)
        engine = LLM(str(path), dtype="float32").engine
        assert engine.runner.fused_decode is None and fused_decoder_unsupported_reason(engine.model) is not None


def test_gemma3_in_bf16_decodes_on_the_torch_path(tiny_model_factory):
    """The fused step has no Gemma binder (its kernel knows neither sliding windows, two rope
    tables, Gemma's (1 + w) norms around attention and MLP, nor a GELU MLP): a bf16 Gemma 3,
    which the fused step would otherwise take, decodes on the torch path, and says why."""
    _, _, path = tiny_model_factory("gemma3")
    engine = LLM(str(path), dtype="bfloat16").engine
    assert engine.runner.fused_decode is None
    assert "Gemma3ForCausalLM has no fused decode step" in fused_decoder_unsupported_reason(engine.model)
    assert engine.runner.decode_path.startswith("torch path")


def test_layer_by_layer_step_equals_one_call_and_lets_a_cut_in_run(tiny_model_factory):
    """Pausable (the online engine), the fused step runs one C++ call per
    layer; it must give the same bits as one call, and a cut-in prefill between layers must not
    disturb the step it cuts into."""
    _, _, path = tiny_model_factory("qwen2")
    engine = LLM(str(path), dtype="bfloat16", scheduling_policy="priority").engine
    for i in range(12):
        engine.add_request(
            [11 + i] * (i + 3), SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), priority=1
        )
    engine.step()
    rows = scheduled_rows(engine)
    assert isinstance(engine.runner.path_for(rows), FusedDecodePath) and len(rows) == 12
    _, one_call, _ = engine.runner.compute_logits(rows)
    calls = []

    def hook():
        calls.append(1)
        if len(calls) == 1:
            engine.add_request(
                [3, 4, 5, 6],
                SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
                request_id="urgent",
                priority=0,
            )
            assert engine.cut_in_step(), "the urgent request should have cut in"

    with torch.inference_mode():
        by_layer = finish(engine.runner.forward_steps(rows, True), hook).values
    assert len(calls) == engine.model.num_layers - 1  # one boundary between each two layers
    assert torch.equal(one_call, by_layer)
    assert engine.get_stats().num_cut_ins == 1


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen2_odd"])
def test_mixed_step_runs_decodes_fused_and_prefill_on_torch(tiny_model_factory, arch):
    """A step with decodes and a prefill chunk: split into the fused decoder and the torch path,
    its logits match the torch path's for the whole step, rows in scheduled order."""
    _, _, path = tiny_model_factory(arch)
    engine = LLM(str(path), dtype="bfloat16", block_size=4).engine
    for p in ([5, 6, 7], list(range(10, 31)), [40] * 9):
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    for _ in range(3):  # the prefill step, then decodes
        engine.step()
    engine.add_request(list(range(50, 63)), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    rows = scheduled_rows(engine)
    lengths = [n for _, n in rows]
    assert sorted(lengths) == [1, 1, 1, 13], "expected three decodes beside one 13-token prefill"
    # The prefill between decodes: the split must put the rows back in this order.
    decodes = [s for s in rows if s[1] == 1]
    rows = decodes[:1] + [s for s in rows if s[1] > 1] + decodes[1:]
    engine.runner.paths_context.split_min_decodes = 1
    assert isinstance(engine.runner.path_for(rows), SplitPath)
    got, ref = both_paths(engine.runner, rows)
    assert got.shape[0] == 4
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() < 0.02 * scale, "split step: logits diverge"
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * scale
    assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_one_token_prompt_chunks_that_score_take_the_torch_path(tiny_model_factory):
    """prompt_logprobs need every prompt position's hidden state, which the fused decoder does
    not hand back: one-token chunks that score go through torch beside fused decodes."""
    _, _, path = tiny_model_factory("llama")
    prompt = list(range(10, 30))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=2)
    whole = LLM(str(path), dtype="bfloat16").generate([prompt], params)[0].prompt_logprobs
    engine = LLM(str(path), dtype="bfloat16", long_prefill_token_threshold=1).engine
    plain = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    engine.add_request([5, 6, 7], plain)
    engine.step()
    engine.step()  # now decoding on the fused path
    rid = engine.add_request(prompt, params)
    runner, split = engine.runner, []
    (split_path,) = [p for p in runner.paths if isinstance(p, SplitPath)]
    real_split = split_path.hidden_steps
    split_path.hidden_steps = lambda rows, pausable: split.append(len(rows)) or real_split(rows, pausable)
    out = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == rid:
                out = o
    assert len(split) >= len(prompt) - 1, "each one-token scored chunk beside a fused decode"
    got = out.prompt_logprobs
    assert len(got) == len(prompt) and got[0] is None
    for t in range(1, len(prompt)):
        assert got[t].keys() == whole[t].keys()
        assert abs(got[t][prompt[t]].logprob - whole[t][prompt[t]].logprob) < 0.02
