import json

import torch

from tacit import LLM, SamplingParams

from tiny_models import build_tokenizer, make_config, save_tokenizer


def test_sharded_safetensors_and_generation_config_eos(tiny_llama, tmp_path):
    model, tok, path = tiny_llama
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    save_tokenizer(tmp_path, tok)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    llm = LLM(str(tmp_path), dtype="float32")
    assert set(llm.engine.config.model.eos_token_ids) == {2, 7}
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ref = LLM(str(path), dtype="float32").generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    assert llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids == ref


def test_missing_shard_is_named(tiny_llama, tmp_path):
    model, tok, _ = tiny_llama
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    save_tokenizer(tmp_path, tok)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[0]
    victim.unlink()
    import pytest

    with pytest.raises(FileNotFoundError, match=victim.name):
        LLM(str(tmp_path))


def test_config_and_weights_disagree(tmp_path):
    import pytest
    import transformers

    tok = build_tokenizer()
    cfg = make_config("llama", tok.get_vocab_size())
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    save_tokenizer(tmp_path, tok)
    bad = json.loads((tmp_path / "config.json").read_text())
    bad["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="config and weights disagree"):
        LLM(str(tmp_path))
    assert torch.get_default_dtype() == torch.float32  # a failed load leaves no global state behind
