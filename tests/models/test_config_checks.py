"""A corrupt or absurd config.json is refused at load, naming the file and the field, within
seconds and before any large allocation."""

import json
import logging
import shutil
import time

import pytest

from tacit import LLM, SamplingParams


def broken_copy(src, dst, edit):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg = edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def set_key(key, value):
    def edit(cfg):
        cfg[key] = value
        return cfg

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            set_key("num_hidden_layers", 1e9),
            r"num_hidden_layers=1000000000.0 is invalid: must be an integer in \[1, 1024\]",
        ),
        (set_key("hidden_size", 10**9), r"hidden_size=1000000000 is invalid"),
        (set_key("hidden_size", "64"), r"hidden_size='64' is invalid"),
        (set_key("intermediate_size", 0), r"intermediate_size=0 is invalid"),
        (set_key("num_attention_heads", -4), r"num_attention_heads=-4 is invalid"),
        (set_key("vocab_size", True), r"vocab_size=True is invalid"),
        (set_key("max_position_embeddings", 1e12), r"max_position_embeddings=1000000000000.0 is invalid: .* >= 1"),
        (set_key("max_position_embeddings", 0), r"max_position_embeddings=0 is invalid"),
        (set_key("num_key_value_heads", 3), r"not a multiple of num_key_value_heads=3"),
        (lambda cfg: [cfg], r"must be a JSON object of settings, got list"),
        (lambda cfg: {k: v for k, v in cfg.items() if k != "vocab_size"}, r"lacks vocab_size"),
    ],
)
def test_broken_config_is_refused_naming_the_field(tiny_llama, tmp_path, edit, message):
    path = broken_copy(tiny_llama[2], tmp_path / "broken", edit)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=message) as info:
        LLM(str(path), dtype="float32")
    assert "config" in str(info.value) or str(path) in str(info.value)
    assert time.monotonic() - t0 < 10


def test_weights_beyond_memory_are_refused_before_allocating(tiny_llama, tmp_path):
    big = {
        "hidden_size": 65536,
        "intermediate_size": 262144,
        "num_hidden_layers": 64,
        "num_attention_heads": 512,
        "num_key_value_heads": 512,
        "head_dim": 128,
    }
    path = broken_copy(tiny_llama[2], tmp_path / "huge", lambda cfg: {**cfg, **big})
    with pytest.raises(ValueError, match=r"weights need .* GiB .* more than the .* GiB free"):
        LLM(str(path), dtype="float32")


def test_huge_max_position_embeddings_is_capped_by_the_kv_cache(tiny_llama, tmp_path, caplog):
    """10**12 positions load (nothing is sized by them) and max_model_len becomes what the KV
    pool holds, so a request without max_tokens still runs."""
    path = broken_copy(tiny_llama[2], tmp_path / "long", set_key("max_position_embeddings", 10**12))
    with caplog.at_level(logging.INFO, logger="tacit.engine"):
        llm = LLM(str(path), dtype="float32", num_kv_blocks=8, block_size=16)
    assert llm.engine.max_model_len == llm.engine.config.model.max_model_len == 8 * 16
    assert "max_model_len capped at 128 tokens" in caplog.text
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 128 - 3 and out.finish_reason == "length"


def test_explicit_max_model_len_is_not_capped(tiny_llama):
    llm = LLM(str(tiny_llama[2]), dtype="float32", num_kv_blocks=8, block_size=16, max_model_len=1024)
    assert llm.engine.max_model_len == 1024
    with pytest.raises(ValueError, match="more than the whole KV pool holds"):
        llm.generate([[5] * 100], SamplingParams(max_tokens=100))
