"""models/quantization.py: one registry picks a model's QuantizationConfig, which says per layer
how it holds its weight; each config gives the layer types build_model gave before it existed
(an if/elif chain in build.py)."""

import dataclasses

import pytest
import torch

from tacit import LLM
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.ggml_quant import GGML_TYPES
from tacit.layers.embedding import GGMLEmbedding
from tacit.layers.ggml_linear_method import GGMLLinearMethod, MixedGGMLLinearMethod
from tacit.layers.linear import LinearBase
from tacit.loader.gguf_writer import export_hf_to_gguf
from tacit.models.quantization import (
    QUANTIZATION_CONFIGS,
    GGMLCheckpointConfig,
    QuantizationConfig,
    QuantizeAtLoadConfig,
    get_quantization_config,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def llama_dir(tiny_model_factory):
    return tiny_model_factory("llama")[2]


def layer_types(llm: LLM) -> dict[str, str]:
    """{linear layer: its GGML type name, or "float"}."""
    out = {}
    for name, m in llm.engine.model.named_modules():
        if isinstance(m, LinearBase):
            method = m.linear_method
            out[name] = method.type_name if isinstance(method, GGMLLinearMethod) else "float"
    return out


def test_the_registry_holds_one_config_per_way_of_holding_weights():
    assert dict(QUANTIZATION_CONFIGS) == {
        "unquantized": QuantizationConfig,
        "quantize_at_load": QuantizeAtLoadConfig,
        "ggml_checkpoint": GGMLCheckpointConfig,
    }


def test_the_config_is_chosen_from_the_settings_and_the_checkpoint(llama_dir):
    cfg = LLM(str(llama_dir), dtype="bfloat16").engine.config.model
    blocks = {"model.layers.0.mlp.down_proj.weight": 2}

    def pick(quantized=None, **changes):
        return type(get_quantization_config(dataclasses.replace(cfg, **changes), CPU, quantized))

    assert pick() is QuantizationConfig
    assert pick(quantization="int8") is QuantizeAtLoadConfig
    assert pick(quantization_overrides={"*.down_proj": "int4"}) is QuantizeAtLoadConfig
    assert pick(blocks, quantization="gguf") is GGMLCheckpointConfig
    assert pick(blocks, quantization="none") is QuantizationConfig
    # auto keeps the blocks where this engine's CPU kernels multiply them, not where it turned them off
    assert pick(blocks, quantization="auto", cpu_kernels=False) is QuantizationConfig
    if load_cpu_kernels(True) is not None:
        assert pick(blocks, quantization="auto") is GGMLCheckpointConfig
    with pytest.raises(ValueError, match="int8/int4 quantize an unquantized Hugging Face checkpoint"):
        get_quantization_config(dataclasses.replace(cfg, quantization="int8"), CPU, blocks).check()


@pytest.mark.parametrize("quantization, want", [("int8", "Q8_0"), ("int4", "Q4_1")])
def test_quantize_at_load_makes_every_linear_but_the_head_that_type(llama_dir, quantization, want):
    types = layer_types(LLM(str(llama_dir), dtype="bfloat16", quantization=quantization))
    assert types.pop("lm_head") == "float"  # kept in the model's dtype (quantize_at_load._KEPT)
    assert len(types) == 2 * 4 and set(types.values()) == {want}


def test_overrides_give_their_layers_their_own_type(llama_dir):
    overrides = {"model.layers.0.mlp.down_proj": "none", "*.o_proj": "int4"}
    types = layer_types(LLM(str(llama_dir), dtype="bfloat16", quantization="int8", quantization_overrides=overrides))
    assert types["model.layers.0.mlp.down_proj"] == "float"
    assert types["model.layers.1.mlp.down_proj"] == "Q8_0"
    assert types["model.layers.0.self_attn.o_proj"] == types["model.layers.1.self_attn.o_proj"] == "Q4_1"


def test_a_gguf_keeps_its_block_types_mixed_shards_and_its_table(tiny_model_factory, tmp_path):
    hf_dir = tiny_model_factory("llama3")[2]  # tied embeddings
    path = export_hf_to_gguf(
        hf_dir, tmp_path / "m.gguf", ggml_types={"": "Q4_1", "attn_v.weight": "Q8_0", "token_embd.weight": "Q8_0"}
    )
    llm = LLM(str(path), dtype="bfloat16", quantization="gguf")
    model, types = llm.engine.model, layer_types(llm)
    assert types["model.layers.0.self_attn.qkv_proj"] == "Q4_1/Q4_1/Q8_0"
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.linear_method, MixedGGMLLinearMethod)
    assert types["model.layers.0.mlp.down_proj"] == types["model.layers.1.self_attn.o_proj"] == "Q4_1"
    table = model.model.embed_tokens
    assert isinstance(table, GGMLEmbedding) and GGML_TYPES[table.ggml_type].name == "Q8_0"
    assert types["lm_head"] == "Q8_0" and model.lm_head.weight is table.weight  # the tied head shares the blocks

    none = LLM(str(path), dtype="bfloat16", quantization="none")
    assert set(layer_types(none).values()) == {"float"}
    assert not isinstance(none.engine.model.model.embed_tokens, GGMLEmbedding)
