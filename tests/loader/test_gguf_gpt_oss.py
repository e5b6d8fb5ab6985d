"""gpt-oss both ways through llama.cpp's `gpt-oss` GGUF layout: tacit writes a tiny HF gpt-oss
as llama.cpp's converter would (names, metadata, split expert stacks and biases) and loads it back
into the same greedy tokens as transformers; Q8_0 and MXFP4 expert stacks load as their blocks
say; llama.cpp itself (in its own process) loads the file and decodes it."""

import numpy as np
import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.loader.gguf_writer import export_hf_to_gguf, reencode_gguf

# The second prompt (31 tokens + 10 generated) outruns the tiny model's 24-token window.
PROMPTS = [[5, 9, 11, 3, 200, 17, 40], list(range(40, 71))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=5)


@pytest.fixture(scope="module")
def gpt_oss(tiny_model_factory, tmp_path_factory):
    """(HF model, HF dir, its float32 GGUF)."""
    model, _, hf_dir = tiny_model_factory("gpt_oss")
    return model, hf_dir, export_hf_to_gguf(hf_dir, tmp_path_factory.mktemp("gpt_oss_gguf") / "f32.gguf")


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def first_logprobs_close(a, b, tol: float) -> None:
    for x, y in zip(a, b):
        for token_id, lp in x.outputs[0].logprobs[0].items():
            other = y.outputs[0].logprobs[0].get(token_id)
            if other is not None:
                assert abs(lp.logprob - other.logprob) < tol


def test_the_file_has_llama_cpps_names_keys_and_layouts(gpt_oss):
    import gguf

    from tacit.loader.hf import iter_safetensors

    _, hf_dir, path = gpt_oss
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields["general.architecture"] == "gpt-oss"
    assert fields["gpt-oss.expert_count"] == 8 and fields["gpt-oss.expert_used_count"] == 2
    assert fields["gpt-oss.expert_feed_forward_length"] == 32
    assert fields["gpt-oss.attention.sliding_window"] == 24
    assert fields["gpt-oss.rope.scaling.type"] == "yarn" and fields["gpt-oss.rope.scaling.factor"] == 16.0
    assert fields["gpt-oss.rope.scaling.original_context_length"] == 64
    tensors = {t.name: t for t in reader.tensors}
    for name in ("attn_sinks.weight", "post_attention_norm.weight", "ffn_gate_inp.bias", "attn_q.bias"):
        assert f"blk.1.{name}" in tensors
    assert "blk.0.ffn_norm.weight" not in tensors
    hf = dict(iter_safetensors(hf_dir))
    gate_up, bias = hf["model.layers.1.mlp.experts.gate_up_proj"], hf["model.layers.1.mlp.experts.gate_up_proj_bias"]
    up = np.array(tensors["blk.1.ffn_up_exps.weight"].data).reshape(8, 32, 64)  # [experts, I, H]
    assert np.array_equal(up, gate_up[..., 1::2].transpose(1, 2).numpy())  # odd columns: up
    assert np.array_equal(np.array(tensors["blk.1.ffn_gate_exps.bias"].data).reshape(8, 32), bias[:, 0::2].numpy())
    down = np.array(tensors["blk.1.ffn_down_exps.weight"].data).reshape(8, 64, 32)  # [experts, H, I]
    assert np.array_equal(down, hf["model.layers.1.mlp.experts.down_proj"].transpose(1, 2).numpy())


def test_float32_gguf_decodes_as_transformers(gpt_oss):
    """The file's names, split stacks, biases, sinks, window and YaRN (truncate false) say what
    the HF checkpoint does: transformers' greedy tokens, past the sliding window too, and the
    first token's log-probabilities within 1e-5 of tacit on the HF directory."""
    model, hf_dir, path = gpt_oss
    got = LLM(str(path), dtype="float32").generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, got):
        assert out.outputs[0].token_ids == hf_greedy(model, prompt, 10)
    first_logprobs_close(got, LLM(str(hf_dir), dtype="float32").generate(PROMPTS, GREEDY), 1e-5)


def test_bf16_gguf_decodes_as_the_hf_directory_in_bf16(gpt_oss, tmp_path):
    """bf16 matrices and expert stacks (round-to-nearest-even, as torch rounds the HF directory's
    float32 weights at load; norms, biases, sinks float32 in both): the same weights in a bf16
    model, so the same tokens and log-probabilities (the C++ MoE kernel in both where the CPU
    has AVX512-BF16)."""
    _, hf_dir, _ = gpt_oss
    path = export_hf_to_gguf(hf_dir, tmp_path / "bf16.gguf", bf16=True)
    got = LLM(str(path), dtype="bfloat16").generate(PROMPTS, GREEDY)
    want = LLM(str(hf_dir), dtype="bfloat16").generate(PROMPTS, GREEDY)
    for x, y in zip(got, want):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    first_logprobs_close(got, want, 1e-6)


def test_q8_0_experts_stay_blocks_and_run_on_the_cpu_kernel_in_bf16(gpt_oss, tmp_path):
    """Q8_0 expert stacks with float32 biases: kept as blocks (FusedMoE.load_expert_stack) they
    decode as the same file dequantized at load (float32: both through the torch kernel's
    dequantization). In bf16 every layer runs the C++ kernel (biases, the clamped SwiGLU, Q8_0
    blocks) and decodes as the torch kernel does on the same model (bf16 activations into the
    Q8_0 GEMVs, the torch kernel's arithmetic; the bounds of the MoE models' test in
    tests/kernels/test_moe_conformance.py)."""
    from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
    from tacit.kernels.torch_moe import TorchMoEKernel
    from tacit.layers.moe import FusedMoE, use_moe_kernel

    q8 = export_hf_to_gguf(gpt_oss[1], tmp_path / "q8.gguf", ggml_types={"_exps.weight": "Q8_0"})
    want = LLM(str(q8), dtype="float32", quantization="none").generate(PROMPTS, GREEDY)
    llm = LLM(str(q8), dtype="float32", quantization="gguf")
    moe = [m for m in llm.engine.model.modules() if isinstance(m, FusedMoE)]
    assert moe and all(m.w13_type == 8 and m.w2_type == 8 and m.w13_bias is not None for m in moe)
    got = llm.generate(PROMPTS, GREEDY)
    for x, y in zip(got, want):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    first_logprobs_close(got, want, 1e-4)
    if not cpu_supports_avx512_bf16():
        return
    runs = {}
    for kernel in ("cpu_fused", "torch"):
        # A fresh engine each: a second generate would hit the prefix cache, and a batch of
        # other sizes rounds the bf16 attention differently (this random model has near-ties).
        llm = LLM(str(q8), dtype="bfloat16", quantization="gguf", ggml_bf16_activations=True)
        moe = [m for m in llm.engine.model.modules() if isinstance(m, FusedMoE)]
        assert moe and all(m.kernel.name == "cpu_fused" and m.w13_type == 8 for m in moe)
        if kernel == "torch":
            use_moe_kernel(llm.engine.model, TorchMoEKernel())
        runs[kernel] = llm.generate(PROMPTS, GREEDY)
    fused, ref = runs["cpu_fused"], runs["torch"]
    for x, y in zip(fused, ref):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    first_logprobs_close(fused, ref, 0.05)


def test_mxfp4_experts_load_as_the_file_dequantized(gpt_oss, tmp_path):
    """MXFP4 expert stacks (GGML type 39, quantized by the gguf package as llama.cpp would): the
    model decodes as the same file with every tensor dequantized to float32 by the gguf package
    (held as MXFP4 blocks where kernels/ggml_quant.GGML_TYPES has the type, else dequantized
    per expert at load)."""
    from tacit.layers.moe import FusedMoE

    _, hf_dir, _ = gpt_oss
    mx = export_hf_to_gguf(hf_dir, tmp_path / "mxfp4.gguf", ggml_types={"_exps.weight": "MXFP4"})
    import gguf

    types = {t.name: int(t.tensor_type) for t in gguf.GGUFReader(str(mx)).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ffn_down_exps.weight"] == 39
    assert types["blk.0.ffn_gate_exps.bias"] == 0  # biases stay float32
    want = LLM(str(reencode_gguf(mx, tmp_path / "deq.gguf", bf16=False)), dtype="float32").generate(PROMPTS, GREEDY)
    llm = LLM(str(mx), dtype="float32")
    assert any(isinstance(m, FusedMoE) for m in llm.engine.model.modules())
    got = llm.generate(PROMPTS, GREEDY)
    for x, y in zip(got, want):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    first_logprobs_close(got, want, 1e-4)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"layer_types": ["full_attention", "sliding_attention"]}, "slides on even layers"),
        ({"swiglu_limit": 8.0}, "fixes swiglu_alpha=1.702, swiglu_limit=7.0; got 1.702, 8.0"),
        ({"rope_parameters": {"truncate": True}}, "YaRN with truncate=true"),
    ],
    ids=["full-first", "limit", "truncate"],
)
def test_the_writer_refuses_what_llama_cpp_would_compute_otherwise(gpt_oss, tmp_path, edit, message):
    import json
    import shutil

    hf_dir = tmp_path / "hf"
    shutil.copytree(gpt_oss[1], hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    for key, value in edit.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        export_hf_to_gguf(hf_dir, tmp_path / "m.gguf")


def test_a_gate_bias_without_its_up_bias_is_named(gpt_oss, tmp_path):
    """A file missing one layer's ffn_up_exps.bias: the error names the tensor that has no partner."""
    import gguf

    reader = gguf.GGUFReader(str(gpt_oss[2]))
    writer = gguf.GGUFWriter(str(tmp_path / "cut.gguf"), "gpt-oss")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name != "blk.1.ffn_up_exps.bias":
            writer.add_tensor(t.name, np.array(t.data).reshape(tuple(reversed([int(d) for d in t.shape]))))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="blk.1.ffn_gate_exps.bias has no blk.1.ffn_up_exps.bias beside it"):
        LLM(str(tmp_path / "cut.gguf"), dtype="float32")


def with_rounded_yarn(model):
    """The same checkpoint with YaRN's correction range rounded out to whole dimensions
    (transformers' truncate=true), as llama.cpp's ggml_rope_yarn_corr_dims computes it."""
    import copy

    cfg = copy.deepcopy(model.config)
    cfg.rope_parameters["truncate"] = True
    rounded = type(model)(cfg).eval()
    rounded.load_state_dict(model.state_dict())
    return rounded


def test_llama_cpp_loads_and_decodes_the_file(gpt_oss):
    """llama.cpp, in its own process (a crash fails this test, not the run), loads tacit's
    gpt-oss GGUF and decodes it as transformers does with YaRN's correction range rounded: a
    GGUF has no key for gpt-oss's truncate=false, and llama.cpp always rounds (on this model its
    logits then agree with transformers' to 1e-5; unrounded, by up to 0.59 of 3.7 and the greedy
    tokens part at the second)."""
    pytest.importorskip("llama_cpp")
    from tacit.bench.peers.process_peer import ProcessPeer

    model, _, path = gpt_oss
    rounded = with_rounded_yarn(model)
    peer = ProcessPeer("llama.cpp", "llamacpp_greedy:LlamaCppGreedy", (str(path), 128), timeout_s=300)
    try:
        for prompt in PROMPTS:
            got = peer.ask("greedy", prompt, 10)
            assert peer.failure is None, peer.failure
            assert got == hf_greedy(rounded, prompt, 10)
    finally:
        peer.close()
