"""gpt-oss beyond the transformers parity suite (tests/models/test_transformers_parity.py checks
its greedy, chunked and preempted tokens): in bf16 on the CPU its experts run the C++ MoE
kernel (biases and the clamped SwiGLU included) and its decode steps the torch path (the fused
C++ step has no gpt-oss binder); its layers take the config's windows and sinks; what it cannot
load is refused by name."""

import json
import shutil

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.config import ModelConfig
from tacit.kernels.cpu_fused_moe import CPUFusedMoEKernel
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.layers.moe import FusedMoE
from tacit.models.gpt_oss import GptOssForCausalLM
from tacit.worker.paths.fused_binders import fused_decoder_unsupported_reason

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
PROMPTS = [[5, 6, 7], list(range(10, 70)), [40] * 9]


def config_with(path, **changes) -> ModelConfig:
    hf = {**json.loads((path / "config.json").read_text()), **changes}
    return ModelConfig(path=str(path), hf=hf, dtype=torch.float32)


@pytest.mark.skipif(load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels: the torch MoE kernel runs")
def test_bf16_runs_the_cpp_moe_kernel_and_the_torch_decode_path(tiny_model_factory):
    _, _, path = tiny_model_factory("gpt_oss")
    llm = LLM(str(path), dtype="bfloat16")
    runner = llm.engine.runner
    assert runner.fused_decode is None
    assert "GptOssForCausalLM has no fused decode step" in fused_decoder_unsupported_reason(runner.model)
    layers = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    assert len(layers) == 2 and all(type(m.kernel) is CPUFusedMoEKernel for m in layers)
    # Not compared with float32 token by token: this model's clamped experts and peaked logits
    # move by up to 4.3 nats (median 0.09) between transformers' own bf16 and float32 runs of it.
    outs = llm.generate(PROMPTS, GREEDY)
    assert [len(o.outputs[0].token_ids) for o in outs] == [12] * 3


def test_layers_take_the_configs_windows_and_sinks(tiny_model_factory):
    model, _, path = tiny_model_factory("gpt_oss")
    layers = LLM(str(path), dtype="float32").engine.runner.model.model.layers
    assert [layer.self_attn.attn.sliding_window for layer in layers] == [24, None]
    for ours, theirs in zip(layers, model.model.layers):
        assert torch.equal(ours.self_attn.attn.sinks, theirs.self_attn.sinks.detach())
        assert ours.mlp.experts.activation.limit == 7.0


def _mxfp4_pair(experts: int, rows: int, cols: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """HF `_blocks` [E, rows, cols / 32, 16] of every code and `_scales` [E, rows, cols / 32] of
    exponents 2^-9..2^-5: values up to 6 * 2^-5, a trained expert's range."""
    blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 123, (experts, rows, cols // 32), dtype=torch.uint8, generator=g)
    return blocks, scales


def test_an_mxfp4_checkpoint_decodes_as_transformers_on_its_dequantized_experts(tiny_model_factory, tmp_path):
    """OpenAI's release format: experts as `_blocks` / `_scales` pairs under quantization_config
    mxfp4. The oracle is transformers on the same checkpoint with those experts dequantized by
    transformers' own convert_moe_packed_tensors; tacit keeps them as MXFP4 blocks."""
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tacit.kernels.ggml_quant import MXFP4

    _, _, path = tiny_model_factory("gpt_oss")
    ref_dir, mx_dir = shutil.copytree(path, tmp_path / "ref"), shutil.copytree(path, tmp_path / "mxfp4")
    hf = json.loads((path / "config.json").read_text())
    experts, hidden, inter = hf["num_local_experts"], hf["hidden_size"], hf["intermediate_size"]
    weights = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    packed = dict(weights)
    for i in range(hf["num_hidden_layers"]):
        for proj, (rows, cols) in {"gate_up_proj": (2 * inter, hidden), "down_proj": (hidden, inter)}.items():
            name = f"model.layers.{i}.mlp.experts.{proj}"
            blocks, scales = _mxfp4_pair(experts, rows, cols, g)
            weights[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()
            del packed[name]
            packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
    save_file(weights, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(packed, str(mx_dir / "model.safetensors"), metadata={"format": "pt"})
    (mx_dir / "config.json").write_text(json.dumps({**hf, "quantization_config": {"quant_method": "mxfp4"}}))

    oracle = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32)
    llm = LLM(str(mx_dir), dtype="float32", quantization="gguf")  # kept as blocks in float32 too
    moe = [m for m in llm.engine.runner.model.modules() if isinstance(m, FusedMoE)]
    assert all(m.w13_type == m.w2_type == MXFP4 for m in moe), "experts were dequantized at load"
    outs = llm.generate(PROMPTS, GREEDY)
    with torch.no_grad():
        for p, o in zip(PROMPTS, outs):
            want = oracle.generate(
                torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            assert o.outputs[0].token_ids == want[0, len(p) :].tolist()


def test_mxfp4_tensors_without_the_config_are_refused_by_name(tiny_model_factory):
    _, _, path = tiny_model_factory("gpt_oss")
    with torch.device("meta"):
        m = GptOssForCausalLM(config_with(path))
    with pytest.raises(ValueError, match="gate_up_proj_blocks: an MXFP4 expert tensor in a checkpoint whose config"):
        m.weight_hook("model.layers.0.mlp.experts.gate_up_proj_blocks", torch.zeros(8, 64, 2, 16, dtype=torch.uint8))


def test_bad_layer_types_are_refused(tiny_model_factory):
    _, _, path = tiny_model_factory("gpt_oss")
    for bad in (["sliding_attention"], ["sliding_attention", "chunked_attention"]):
        with pytest.raises(ValueError, match="must name each of the 2 layers one of sliding_attention, full_attention"):
            with torch.device("meta"):
                GptOssForCausalLM(config_with(path, layer_types=bad))


def test_int8_at_load_quantizes_the_attention_and_keeps_the_experts(tiny_model_factory):
    """transformers' expert stacks are not the per-expert matrices quantize-at-load converts, so
    --quantization int8 leaves them (and the router) in the model's dtype."""
    from tacit.layers.ggml_linear_method import GGMLLinearMethod

    _, _, path = tiny_model_factory("gpt_oss")
    llm = LLM(str(path), dtype="bfloat16", quantization="int8")
    layer = llm.engine.runner.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj.linear_method, GGMLLinearMethod)
    assert layer.mlp.experts.w13.dtype == torch.bfloat16 and layer.mlp.experts.w13_type is None
    assert layer.mlp.router.weight.dtype == torch.bfloat16
    outs = llm.generate(PROMPTS, GREEDY)
    assert [len(o.outputs[0].token_ids) for o in outs] == [12] * 3


def test_the_real_yarn_rope_is_transformers_bit_for_bit():
    """gpt-oss-20b's rope (recipes/configs): YaRN factor 32 over 4096 positions, beta 32 / 1 and
    truncate false (the correction range left fractional), attention factor 0.1 ln 32 + 1."""
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tacit.layers.rotary import RotaryEmbedding
    from tacit.perf_model.model_shape import load_hf_config

    hf = {k: v for k, v in load_hf_config("gpt-oss-20b").items() if k != "quantization_config"}
    cfg = ModelConfig(path="gpt-oss-20b", hf=hf, dtype=torch.float32)
    ours = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS["yarn"](GptOssConfig(**hf), "cpu")
    assert torch.equal(ours.inv_freq, inv_freq) and ours.attention_scaling == scaling
    truncated = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, {**cfg.rope, "truncate": True})
    assert not torch.equal(truncated.inv_freq, inv_freq)  # the setting matters at these numbers
