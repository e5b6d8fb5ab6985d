"""A multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration: Gemma 3's 4B, 12B and 27B)
loads its text decoder as Gemma3ForCausalLM: text prompts give the full model's greedy tokens,
from either era's weight names, in one process and split over two."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tacit import LLM, SamplingParams
from tacit.config import ModelConfig
from tacit.loader.multimodal import text_decoder_config, text_decoder_weights, text_weight_name

from tiny_models import build_tokenizer, make_config, save_tokenizer

CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "configs"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
LENGTHS = [7, 45, 100]  # the longer ones past the tiny decoder's 32-token window


@pytest.fixture(scope="module")
def wrapper(tmp_path_factory):
    """(transformers' model, its directory, a copy in transformers 5's weight names): the tiny
    Gemma 3 decoder under a one-layer SigLIP tower, saved as transformers saves it (the released
    checkpoints' `language_model.model.*` names, no lm_head: tied), its text_config made sparse as
    the released ones are (query_pre_attn_scalar, tie_word_embeddings and rms_norm_eps left to
    transformers' defaults)."""
    import transformers as tf

    tok = build_tokenizer()
    text = make_config("gemma3", tok.get_vocab_size()).to_dict()
    text.update(query_pre_attn_scalar=256, initializer_range=0.15)
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    cfg = tf.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=tok.get_vocab_size() - 1,
        boi_token_index=1,
        eoi_token_index=2,
    )
    torch.manual_seed(0)
    model = tf.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("gemma3_mm")
    model.save_pretrained(path)
    save_tokenizer(path, tok)
    config = json.loads((path / "config.json").read_text())
    for key in ("query_pre_attn_scalar", "tie_word_embeddings", "rms_norm_eps"):
        config["text_config"].pop(key, None)
    (path / "config.json").write_text(json.dumps(config))
    # transformers 5's own layout: model.language_model.*, model.vision_tower.*, ...
    v5 = tmp_path_factory.mktemp("gemma3_mm_v5")
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (v5 / f).write_bytes((path / f).read_bytes())
    tensors = load_file(str(path / "model.safetensors"))
    assert any(n.startswith("language_model.model.") for n in tensors) and "lm_head.weight" not in tensors
    save_file(
        {"model." + n.replace("language_model.model.", "language_model."): t for n, t in tensors.items()},
        str(v5 / "model.safetensors"),
    )
    return model, path, v5


def expected(model, prompts):
    with torch.no_grad():
        return [
            model.generate(
                torch.tensor([p]),
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                min_new_tokens=8,
            )[0, len(p) :].tolist()
            for p in prompts
        ]


def prompts():
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(3, 380, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.mark.parametrize("layout", ["released", "transformers5"])
def test_text_prompts_give_the_full_models_tokens(wrapper, layout):
    model, released, v5 = wrapper
    llm = LLM(str(released if layout == "released" else v5), dtype="float32")
    assert llm.engine.config.model.architecture == "Gemma3ForCausalLM"
    decoder = llm.engine.model
    assert decoder.tie_word_embeddings and decoder.model.layers[0].self_attn.attn.scale == 256**-0.5
    got = [o.outputs[0].token_ids for o in llm.generate(prompts(), GREEDY)]
    assert got == expected(model, prompts())


def test_split_over_two_ranks_reads_its_slices_by_the_checkpoints_names(wrapper):
    model, released, _ = wrapper
    llm = LLM(str(released), dtype="float32", tensor_parallel_size=2)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts(), GREEDY)]
    finally:
        llm.engine.shutdown()
    assert got == expected(model, prompts())


def test_the_27b_file_flattens_with_transformers_defaults():
    config = json.loads((CONFIGS / "Gemma-3-27B" / "config.json").read_text())
    hf = text_decoder_config(config)
    assert hf["architectures"] == ["Gemma3ForCausalLM"] and hf["eos_token_id"] == [1, 106]
    assert (hf["vocab_size"], hf["num_hidden_layers"], hf["hidden_size"], hf["head_dim"]) == (262_208, 62, 5376, 128)
    assert "vision_config" not in hf and "text_config" not in hf
    cfg = ModelConfig(path="Gemma-3-27B", hf=hf, dtype=torch.bfloat16)
    assert cfg.max_model_len == 131_072 and cfg.num_kv_heads == 16


def test_the_image_parts_are_never_read():
    asked = []

    def read(skip=None, shards=None):
        names = [
            "language_model.model.norm.weight",
            "vision_tower.x.weight",
            "multi_modal_projector.w",
            "model.language_model.embed_tokens.weight",
            "model.vision_tower.y",
            "language_model.lm_head.weight",
        ]
        for n in names:
            asked.append((n, skip(n), n in shards))
            if not skip(n):
                yield n, torch.zeros(1)

    got = [n for n, _ in text_decoder_weights(read)(shards={"model.norm.weight": (0, 0, 1)})]
    assert got == ["model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"]
    assert [n for n, skipped, _ in asked if skipped] == [
        "vision_tower.x.weight",
        "multi_modal_projector.w",
        "model.vision_tower.y",
    ]
    assert [n for n, _, sharded in asked if sharded] == ["language_model.model.norm.weight"]
    assert text_weight_name("vision_tower.x") is None


def test_a_wrapper_without_text_config_is_refused():
    with pytest.raises(ValueError, match="Gemma3ForConditionalGeneration: config.json has no text_config"):
        text_decoder_config({"architectures": ["Gemma3ForConditionalGeneration"]})
