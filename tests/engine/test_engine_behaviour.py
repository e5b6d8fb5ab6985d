"""Stop conditions, output shapes and the clear errors every bad input gets."""

import json
import subprocess
import sys

import pytest

from tacit import LLM, SamplingParams
from tacit.loader.default_model import default_model_path


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama[2]), dtype="float32")


def greedy(**kw):
    return SamplingParams(temperature=0.0, **kw)


def test_outputs_in_input_order_and_strings_or_ids(llm):
    prompts = ["Paris is", [5, 6, 7], "The quick brown fox jumps over the lazy dog."]
    outs = llm.generate(prompts, greedy(max_tokens=5, ignore_eos=True))
    assert [o.prompt for o in outs] == ["Paris is", None, prompts[2]]
    assert outs[1].prompt_token_ids == [5, 6, 7]
    for o in outs:
        assert len(o.outputs[0].token_ids) == 5
        assert o.outputs[0].text == llm.get_tokenizer().decode(o.outputs[0].token_ids)


def test_stop_token_ids_and_eos(llm):
    base = llm.generate(["Paris is"], greedy(max_tokens=8, ignore_eos=True))[0].outputs[0]
    stop_at = base.token_ids[3]
    out = llm.generate(["Paris is"], greedy(max_tokens=8, ignore_eos=True, stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.token_ids == base.token_ids[: base.token_ids.index(stop_at) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    # The same token as the model's EOS stops generation unless ignore_eos.
    llm.engine.scheduler.eos_token_ids = frozenset({stop_at})
    try:
        eos = llm.generate(["Paris is"], greedy(max_tokens=8))[0].outputs[0]
        assert eos.finish_reason == "stop" and eos.token_ids[-1] == stop_at
        ignored = llm.generate(["Paris is"], greedy(max_tokens=8, ignore_eos=True))[0].outputs[0]
        assert ignored.token_ids == base.token_ids and ignored.finish_reason == "length"
    finally:
        llm.engine.scheduler.eos_token_ids = frozenset(llm.engine.config.model.eos_token_ids)


def test_stop_string_truncates_text(llm):
    base = llm.generate(["Paris is"], greedy(max_tokens=12, ignore_eos=True))[0].outputs[0]
    stop = base.text[4:7]
    assert stop
    out = llm.generate(["Paris is"], greedy(max_tokens=12, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == base.text[: base.text.find(stop)]


def test_n_completions(llm):
    out = llm.generate(["Paris is"], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=6, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_max_model_len_caps_generation(tiny_llama):
    llm = LLM(str(tiny_llama[2]), dtype="float32", max_model_len=12)
    out = llm.generate([[5] * 8], greedy(max_tokens=100, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("", "prompt is empty"),
        ({"text": "hi"}, "prompt must be a string or a list of token ids"),
        ([1.5, 2], "prompt must be a string or a list of token ids"),
        ([10**6], "out of range; valid ids are 0.."),
    ],
)
def test_bad_prompts(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], greedy())
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate(["ok"], greedy(max_tokens=2))[0].outputs[0].token_ids  # still serving


def test_prompt_longer_than_context(llm):
    with pytest.raises(ValueError, match=r"prompt is 2000 tokens, but max_model_len is 1024"):
        llm.generate([[5] * 2000], greedy())


def test_request_larger_than_kv_pool(tiny_llama):
    # An explicit max_model_len: the one derived from the model is capped at the pool's 32 tokens.
    llm = LLM(str(tiny_llama[2]), dtype="float32", num_kv_blocks=2, block_size=16, max_model_len=1024)
    with pytest.raises(ValueError, match="more than the whole KV pool holds"):
        llm.generate([[5] * 30], greedy(max_tokens=10))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_k=-5), "top_k"),
        (dict(min_p=2), "min_p"),
        (dict(max_tokens=-1), "max_tokens"),
        (dict(prompt_logprobs=21), "prompt_logprobs"),
        (dict(n=0), "n"),
        (dict(logprobs=99), "logprobs"),
        (dict(stop=[""]), "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}="):
        SamplingParams(**kwargs)


def test_missing_and_broken_models(tmp_path, tiny_llama):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (tmp_path / "tokenizer.json").write_text((tiny_llama[2] / "tokenizer.json").read_text())
    with pytest.raises(
        ValueError, match="'GPT2LMHeadModel' is not supported; supported: DeepseekV32ForCausalLM, Deeps"
    ):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text((tiny_llama[2] / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError, match="pickle checkpoints are never loaded"):
        LLM(str(tmp_path))
    (tmp_path / "weights.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a .gguf file"):
        LLM(str(tmp_path / "weights.txt"))


def test_missing_default_model_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("TACIT_CACHE_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="fetch it with: tacit fetch"):
        LLM()


def test_cli_reports_missing_model(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "generate", "--model", str(tmp_path / "m"), "--prompt", "hi"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.skipif(not default_model_path().exists(), reason="default model not fetched (run: tacit fetch)")
def test_cli_chat_scripted_answers_paris():
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "chat", "--max-tokens", "24"],
        input="What is the capital of France?\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
