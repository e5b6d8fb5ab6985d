"""--quantization int8 | int4 on a Hugging Face checkpoint: the linear layers are quantized at
load into Q8_0 / Q4_1 blocks, the rest stays in the model's dtype.

The reference is the same checkpoint with those weights replaced by their dequantized values
and run unquantized: quantized execution must be exact to its own quantization. In float32
both runs multiply the same float32 weights (the torch reference dequantizes the blocks), so
tokens and logprobs agree; in bf16 the kernels dequantize each block to bf16 in registers, as
loading the dequantized weights in bf16 rounds them, so the greedy tokens agree.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels
from tacit.kernels.weight_quant import quantize_int4_groupwise, quantize_int8_groupwise, quantize_int8_per_channel
from tacit.layers.ggml_linear_method import GGMLLinearMethod
from tacit.loader.gguf_writer import export_hf_to_gguf

PROMPTS = ["Paris is the capital of", [5, 9, 11, 3, 200], list(range(20, 60))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
KERNELS = cpu_supports_avx512_bf16() and not os.environ.get("TACIT_NO_CPU_KERNELS")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def tiny_llama_dir(tiny_model_factory):
    return tiny_model_factory("llama")[2]


def assert_same_tokens_and_logprobs(outs: list, ref_outs: list, tol: float = 1e-4) -> None:
    """Greedy tokens equal, and every returned logprob within tol."""
    for o, r in zip(outs, ref_outs):
        assert o.outputs[0].token_ids == r.outputs[0].token_ids
        for got, want in zip(o.outputs[0].logprobs, r.outputs[0].logprobs):
            assert got.keys() == want.keys()
            assert all(abs(got[t].logprob - want[t].logprob) < tol for t in got)


def ggml_layers(llm: LLM) -> dict[str, str]:
    return {
        name: m.linear_method.type_name
        for name, m in llm.engine.model.named_modules()
        if isinstance(getattr(m, "linear_method", None), GGMLLinearMethod)
    }


def run(path: Path, **kwargs):
    llm = LLM(str(path), **kwargs)
    return llm.generate(PROMPTS, PARAMS), llm


def copy_model_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    return dst


def quantize(t: torch.Tensor, quantization: str, group: int | None):
    """The formula each --quantization / --quantization-group-size names (unset group: int8 per
    output channel, int4 groups of 32)."""
    if quantization == "int4":
        return quantize_int4_groupwise(t, group or 32)
    return quantize_int8_per_channel(t) if group is None else quantize_int8_groupwise(t, group)


def dequantized_dir(src: Path, dst: Path, quantization: str, group: int | None = None) -> Path:
    """The checkpoint with its linear weights (not lm_head) replaced by dequantize(quantize(w))."""
    copy_model_dir(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    for name, t in tensors.items():
        if name.rsplit(".", 2)[-2] in LINEARS and name.endswith(".weight"):
            tensors[name] = quantize(t, quantization, group).dequantize(t.dtype)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


CASES = [("int8", None, "Q8_0"), ("int8", 32, "Q8_0"), ("int4", None, "Q4_1"), ("int4", 64, "Q4_1")]


@pytest.mark.parametrize("quantization,group,type_name", CASES)
def test_linear_layers_run_exactly_their_own_quantization(tiny_llama_dir, tmp_path, quantization, group, type_name):
    outs, llm = run(tiny_llama_dir, dtype="float32", quantization=quantization, quantization_group_size=group)
    layers = ggml_layers(llm)
    # qkv, o, gate_up, down in each of 2 layers; not lm_head, not the embeddings
    assert len(layers) == 2 * 4 and set(layers.values()) == {type_name} and "lm_head" not in layers
    model = llm.engine.model
    assert model.lm_head.weight.dtype == model.model.embed_tokens.weight.dtype == torch.float32
    assert model.model.layers[0].input_layernorm.weight.dtype == torch.float32
    ref_outs, ref = run(dequantized_dir(tiny_llama_dir, tmp_path / "deq", quantization, group), dtype="float32")
    assert ggml_layers(ref) == {}
    assert_same_tokens_and_logprobs(outs, ref_outs)
    # per channel and per group are different formulas: the other's weights are not these
    if quantization == "int8":
        t = load_file(str(tiny_llama_dir / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
        other = quantize(t, "int8", 32 if group is None else None).data
        assert not torch.equal(quantize(t, "int8", group).data, other)
    # and the quantization changed something: int4 moves the logprobs of the unquantized model
    if quantization == "int4":
        plain = run(tiny_llama_dir, dtype="float32")[0]
        first = [next(iter(o.outputs[0].logprobs[0].values())).logprob for o in (outs[0], plain[0])]
        assert first[0] != first[1]


@pytest.mark.skipif(not KERNELS or load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels")
@pytest.mark.parametrize("quantization,type_name", [("int8", "Q8_0"), ("int4", "Q4_1")])
def test_bf16_runs_the_fused_decoder_with_the_dequantized_tokens(
    tiny_llama_dir, tmp_path, quantization, type_name, bf16_ggml_activations
):
    outs, llm = run(tiny_llama_dir, dtype="bfloat16", quantization=quantization)
    assert set(ggml_layers(llm).values()) == {type_name}
    assert llm.engine.runner.fused_decode is not None
    ref_outs, ref = run(dequantized_dir(tiny_llama_dir, tmp_path / "deq", quantization), dtype="bfloat16")
    assert ggml_layers(ref) == {}
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref_outs]
    weight_bytes = [sum(p.nbytes for p in x.engine.model.model.layers.parameters()) for x in (llm, ref)]
    assert weight_bytes[0] < (0.6 if quantization == "int8" else 0.4) * weight_bytes[1]


def test_tied_head_stays_the_embedding(tiny_model_factory):
    """llama3 tiny: tied embeddings and attention biases; the head is the (unquantized) table."""
    outs, llm = run(tiny_model_factory("llama3")[2], dtype="float32", quantization="int4")
    model = llm.engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight and "lm_head" not in ggml_layers(llm)
    assert model.model.layers[0].self_attn.qkv_proj.bias.dtype == torch.float32
    assert len(ggml_layers(llm)) == 8 and all(len(o.outputs[0].token_ids) == 12 for o in outs)


@pytest.mark.parametrize("quantization,type_id", [("int8", 8), ("int4", 3)])
def test_moe_experts_quantize_and_the_router_stays(tiny_model_factory, tmp_path, quantization, type_id):
    path = tiny_model_factory("qwen3_moe")[2]
    outs, llm = run(path, dtype="float32", quantization=quantization)
    layers = ggml_layers(llm)
    assert "model.layers.0.mlp.gate" not in layers and "model.layers.1.mlp.gate_up_proj" in layers
    experts = llm.engine.model.model.layers[0].mlp.experts
    assert experts.w13.dtype == experts.w2.dtype == torch.uint8 and experts.w13_type == experts.w2_type == type_id
    ref_outs, _ = run(dequantized_dir(path, tmp_path / "deq", quantization), dtype="float32")
    assert_same_tokens_and_logprobs(outs, ref_outs)


@pytest.mark.skipif(not KERNELS or load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels")
def test_bf16_moe_runs_quantized_experts_in_the_fused_step(tiny_model_factory, tmp_path, bf16_ggml_activations):
    path = tiny_model_factory("qwen3_moe")[2]
    outs, llm = run(path, dtype="bfloat16", quantization="int8")
    assert llm.engine.runner.fused_decode is not None
    assert llm.engine.model.model.layers[0].mlp.experts.w13_type == 8
    ref_outs, _ = run(dequantized_dir(path, tmp_path / "deq", "int8"), dtype="bfloat16")
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref_outs]


def test_expert_overrides_and_ragged_expert_groups(tiny_model_factory):
    path = tiny_model_factory("qwen3_moe")[2]
    llm = LLM(
        str(path), dtype="float32", quantization="int4", quantization_overrides={"model.layers.*.mlp.experts": "none"}
    )
    assert llm.engine.model.model.layers[0].mlp.experts.w13.dtype == torch.float32
    assert set(ggml_layers(llm).values()) == {"Q4_1"}
    # the tiny experts are 32 wide: whole 32-groups, not 64-groups
    with pytest.raises(ValueError, match=r"mlp.experts \(down\) \(32 inputs\)"):
        LLM(str(path), dtype="float32", quantization="int4", quantization_group_size=64)


def test_mla_keeps_kv_b_proj_dense(tiny_model_factory):
    """DeepSeek's attention absorbs kv_b_proj's weight itself; its other projections quantize."""
    outs, llm = run(tiny_model_factory("deepseek_v3")[2], dtype="float32", quantization="int4")
    layers = ggml_layers(llm)
    assert "model.layers.0.self_attn.kv_b_proj" not in layers
    assert layers["model.layers.0.self_attn.kv_a_proj_with_mqa"] == "Q4_1"
    assert layers["model.layers.1.mlp.shared_experts.down_proj"] == "Q4_1"
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)


def test_group_size_outside_32_64_128_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="quantization_group_size=48 is not supported; valid: 32, 64, 128"):
        LLM(str(tiny_llama_dir), quantization="int4", quantization_group_size=48)


def test_layers_whose_inputs_are_not_whole_groups_are_named(tiny_llama_dir, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"quantization_group_size=128: model.layers.0.self_attn.qkv_proj \(64 inputs\), .*"
        r"valid group sizes: 32, 64, 128, one that divides every quantized layer's inputs \(here: 32, 64\)",
    ):
        LLM(str(tiny_llama_dir), dtype="float32", quantization="int4", quantization_group_size=128)
    # a model whose down_proj reads 80 values (the config alone: refused before the weights load)
    odd = copy_model_dir(tiny_llama_dir, tmp_path / "odd")
    shutil.copy(tiny_llama_dir / "model.safetensors", odd / "model.safetensors")
    cfg = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 80}))
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.down_proj \(80 inputs\), .*not a multiple of 64"):
        LLM(str(odd), dtype="float32", quantization="int4", quantization_group_size=64)
    with pytest.raises(ValueError, match=r"'int8' stores each row as 32-value Q8_0 blocks; model.layers.0.mlp.down"):
        LLM(str(odd), dtype="float32", quantization="int8")


def test_int8_on_a_gguf_is_refused(tiny_llama_dir, tmp_path):
    path = export_hf_to_gguf(tiny_llama_dir, tmp_path / "tiny.gguf", ggml_types={"": "Q8_0"})
    for q in ("int8", "int4"):
        with pytest.raises(
            ValueError,
            match=f"quantization='{q}': int8/int4 quantize a Hugging Face checkpoint at load; "
            "a GGUF's weights are already quantized: use auto|gguf|none",
        ):
            LLM(str(path), quantization=q)


def test_auto_leaves_a_hugging_face_checkpoint_unquantized(tiny_llama_dir):
    assert ggml_layers(run(tiny_llama_dir, dtype="float32")[1]) == {}
