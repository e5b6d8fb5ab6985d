"""gpt-oss beyond the transformers parity suite (tests/models/test_transformers_parity.py checks
its greedy, chunked and preempted tokens): in bf16 on the CPU its experts run the torch MoE
kernel (the C++ one declines biases and the clamped SwiGLU) and its decode steps the torch path
(the fused C++ step has no gpt-oss binder); its layers take the config's windows and sinks;
what it cannot load is refused by name."""

import json
import shutil

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.config import ModelConfig
from tacit.kernels.torch_moe import TorchMoEKernel
from tacit.layers.moe import FusedMoE
from tacit.models.gpt_oss import GptOssForCausalLM
from tacit.worker.paths.fused_binders import fused_decoder_unsupported_reason

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
PROMPTS = [[5, 6, 7], list(range(10, 70)), [40] * 9]


def config_with(path, **changes) -> ModelConfig:
    hf = {**json.loads((path / "config.json").read_text()), **changes}
    return ModelConfig(path=str(path), hf=hf, dtype=torch.float32)


def test_bf16_runs_the_torch_moe_kernel_and_the_torch_decode_path(tiny_model_factory):
    _, _, path = tiny_model_factory("gpt_oss")
    llm = LLM(str(path), dtype="bfloat16")
    runner = llm.engine.runner
    assert runner.fused_decode is None
    assert "GptOssForCausalLM has no fused decode step" in fused_decoder_unsupported_reason(runner.model)
    layers = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    assert len(layers) == 2 and all(type(m.kernel) is TorchMoEKernel for m in layers)
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


def test_an_mxfp4_checkpoint_is_refused_by_name(tiny_model_factory, tmp_path):
    _, _, path = tiny_model_factory("gpt_oss")
    with pytest.raises(ValueError, match="quant_method 'mxfp4'"):
        with torch.device("meta"):
            GptOssForCausalLM(config_with(path, quantization_config={"quant_method": "mxfp4"}))
    copy = shutil.copytree(path, tmp_path / "mxfp4")
    hf = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**hf, "quantization_config": {"quant_method": "mxfp4"}}))
    with pytest.raises(ValueError, match="mxfp4"):
        LLM(str(copy), dtype="float32")
    with torch.device("meta"):
        m = GptOssForCausalLM(config_with(path))
    with pytest.raises(ValueError, match="gate_up_proj_blocks: MXFP4 expert tensors are not loaded yet"):
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
