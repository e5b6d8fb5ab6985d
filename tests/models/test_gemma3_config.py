"""Gemma 3's config as tacit reads it: the layer pattern and the two ropes from either era's keys
(transformers 5's rope_parameters per layer type, or the released checkpoints' flat rope_theta /
rope_local_base_freq / rope_scaling / sliding_window_pattern) agree with transformers' own
parsing, and what tacit does not run is refused by name."""

import json
from pathlib import Path

import pytest
import torch

from tacit.config import ModelConfig
from tacit.models.gemma3 import Gemma3ForCausalLM, gemma3_layer_types, gemma3_rope_parameters

CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "configs"


def released(name: str) -> dict:
    hf = json.loads((CONFIGS / name / "config.json").read_text())
    return hf.get("text_config", hf)


@pytest.mark.parametrize("name", ["Gemma-3-1B", "Gemma-3-27B"])
def test_released_configs_parse_as_transformers_does(name):
    import transformers

    hf = released(name)
    ref = transformers.Gemma3TextConfig(**{k: v for k, v in hf.items() if k != "model_type"})
    assert gemma3_layer_types(hf) == ref.layer_types
    ropes = gemma3_rope_parameters(hf)
    for kind, rope in ref.rope_parameters.items():
        assert float(ropes[kind]["rope_theta"]) == float(rope["rope_theta"])
        assert ropes[kind]["rope_type"] == rope["rope_type"]
        assert ropes[kind].get("factor") == rope.get("factor")
    # transformers 5's own writing of the same config reads the same.
    written = ref.to_dict()
    written.pop("_sliding_window_pattern", None)
    assert gemma3_layer_types(written) == ref.layer_types
    assert gemma3_rope_parameters(written) == ropes


def test_the_27b_pattern_and_ropes():
    hf = released("Gemma-3-27B")
    types = gemma3_layer_types(hf)
    assert len(types) == 62 and types.count("full_attention") == 10 and types[5] == "full_attention"
    ropes = gemma3_rope_parameters(hf)
    assert ropes["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}
    assert ropes["sliding_attention"] == {"rope_type": "default", "rope_theta": 10_000.0}


def tiny(**extra) -> ModelConfig:
    hf = dict(
        architectures=["Gemma3ForCausalLM"],
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        sliding_window_pattern=3,
    )
    return ModelConfig(path="tiny-gemma3", hf={**hf, **extra}, dtype=torch.float32)


def build(cfg: ModelConfig) -> Gemma3ForCausalLM:
    with torch.device("meta"):
        return Gemma3ForCausalLM(cfg)


def test_the_released_1b_ties_its_head_without_saying_so():
    # Its config.json has no tie_word_embeddings (transformers' default is True) and no lm_head.
    model = build(tiny())
    assert model.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert not build(tiny(tie_word_embeddings=False)).tie_word_embeddings
    windows = [layer.self_attn.attn.sliding_window for layer in model.model.layers]
    assert windows == [8, 8, None]
    assert model.model.layers[0].self_attn.attn.scale == 16**-0.5  # query_pre_attn_scalar unset: head_dim
    assert build(tiny(query_pre_attn_scalar=24)).model.layers[0].self_attn.attn.scale == 24**-0.5


@pytest.mark.parametrize(
    "extra, match",
    [
        (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0 is not supported"),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (dict(hidden_activation="silu"), "hidden_activation='silu' is not supported; valid: gelu_pytorch_tanh, gelu"),
        (dict(layer_types=["sliding_attention"]), "must list num_hidden_layers=3 entries"),
        (dict(layer_types=["local"] * 3), "must list num_hidden_layers=3 entries"),
        (dict(sliding_window=None), "sliding layers need sliding_window"),
    ],
)
def test_what_is_not_run_is_refused_by_name(extra, match):
    with pytest.raises(ValueError, match=match):
        build(tiny(**extra))
