"""`tacit eval kld` on tiny random float32 models: a model against itself, against a perturbed
copy (checked against transformers' own logits), the full-vocabulary scoring under chunked
prefill, the errors a useless text must raise, and llama.cpp as a peer on the same GGUF (those
tests skip without llama-cpp-python; its errors are tested without it)."""

import copy
import json
import shutil
import sys

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.cli import main
from tacit.config.engine_args import EngineArgs
from tacit.eval.kld import chunk_ids, compare, default_text, read_text, run_kld

MAX_TOKENS = 300
CONTEXT = 128


def args(path, **kw) -> EngineArgs:
    return EngineArgs.from_kwargs(model=str(path), dtype="float32", **kw)


def hf_chunk_logprobs(model, chunks) -> list[torch.Tensor]:
    """transformers' float32 log-softmax, each chunk from its own start, last row dropped (it
    predicts the token after the chunk, which nothing scores)."""
    with torch.no_grad():
        return [model(torch.tensor([c])).logits[0, :-1].float().log_softmax(-1) for c in chunks]


@pytest.fixture(scope="module")
def perturbed(tiny_llama, tmp_path_factory):
    """A copy of the tiny llama with layer 0's MLP output scaled by 1.3: (hf model, path)."""
    model, _, path = tiny_llama
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.mul_(1.3)
    out = tmp_path_factory.mktemp("llama_perturbed")
    other.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(path / name, out / name)
    return other, out


def test_default_text_is_long_real_prose(tiny_llama):
    text = default_text()
    assert "the" in text and len(text) > 100_000
    assert text == default_text()  # deterministic
    assert len(tiny_llama[1].encode(text).ids) >= 2_000


def test_model_against_itself_is_zero(tiny_llama):
    path = tiny_llama[2]
    r = run_kld(args(path), args(path), default_text(), MAX_TOKENS, CONTEXT)
    assert r.num_tokens == MAX_TOKENS - -(-MAX_TOKENS // CONTEXT)  # one unpredicted token per chunk
    assert abs(r.kld_mean) < 1e-6 and abs(r.kld_max) < 1e-6
    assert r.ppl_model == r.ppl_reference and r.delta_ppl == 0.0
    assert r.top1_agreement == 1.0
    assert r.bits_per_weight == 32.0  # float32 weights, nothing quantized


def test_perturbed_model_matches_transformers(tiny_llama, perturbed):
    ref_model, _, ref_path = tiny_llama
    model, model_path = perturbed
    text = default_text()
    r = run_kld(args(model_path), args(ref_path), text, MAX_TOKENS, CONTEXT)
    ids = LLM(str(ref_path), dtype="float32").get_tokenizer().encode(text)[:MAX_TOKENS]
    chunks = chunk_ids(ids, CONTEXT)
    expect = compare(hf_chunk_logprobs(ref_model, chunks), hf_chunk_logprobs(model, chunks), chunks, CONTEXT)
    assert r.kld_mean > 1e-3  # the perturbation shows
    assert r.num_tokens == expect.num_tokens
    for name in ("kld_mean", "kld_median", "kld_p99", "kld_max", "ppl_reference", "ppl_model"):
        assert getattr(r, name) == pytest.approx(getattr(expect, name), rel=1e-3, abs=1e-5), name
    assert abs(r.top1_agreement - expect.top1_agreement) <= 2 / r.num_tokens  # near-ties may flip


def test_full_logprobs_chunked_prefill_and_cache_intact(tiny_llama):
    """Prefill forced into 8-token chunks scores every position like transformers, and a
    greedy request afterwards still matches transformers (the scoring left the cache sound)."""
    model, _, path = tiny_llama
    llm = LLM(str(path), dtype="float32", max_num_batched_tokens=16, long_prefill_token_threshold=8)
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in (40, 2, 25)]
    got = llm.score_full_logprobs(chunks)
    for a, b in zip(got, hf_chunk_logprobs(model, chunks)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    prompt = chunks[0][:20]
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0].token_ids
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, 20:].tolist()
    assert list(out) == ref


def test_short_or_empty_text_is_an_error(tiny_llama, tmp_path):
    path = tiny_llama[2]
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(ValueError, match="empty"):
        read_text(str(empty))
    with pytest.raises(ValueError, match="at least 2"):
        run_kld(args(path), args(path), "a", MAX_TOKENS, CONTEXT)
    with pytest.raises(ValueError, match="at least 2"):
        chunk_ids([5], CONTEXT)
    assert main(["eval", "kld", "--model", str(path), "--text", str(empty)]) == 2


def test_cli_writes_json(tiny_llama, perturbed, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(default_text()[:4000])
    out = tmp_path / "kld.json"
    argv = ["eval", "kld", "--model", str(perturbed[1]), "--reference", str(tiny_llama[2]), "--dtype", "float32"]
    argv += ["--text", str(text), "--max-tokens", "100", "--context", "64", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["num_tokens"] == 98 and data["kld_mean"] > 0
    assert data["bits_per_weight"] == 32.0  # what `tacit eval plot-kld` puts on its x axis
    assert "KLD mean" in capsys.readouterr().out


def test_reference_args_apply_to_the_reference_only(tiny_llama):
    from tacit.cli import build_parser
    from tacit.eval.kld import reference_engine_args

    ns = build_parser().parse_args(
        ["eval", "kld", "--model", "m.gguf", "--reference-args", "quantization=none, dtype=float32"]
    )
    ref = reference_engine_args(ns)
    assert (ref.model, ref.quantization, ref.dtype) == ("m.gguf", "none", "float32")
    assert EngineArgs.from_cli_args(ns).quantization != "none"
    ns.reference_args = "nonsense=1"
    with pytest.raises(ValueError, match="nonsense"):
        reference_engine_args(ns)


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama, tmp_path_factory):
    """The tiny llama as an all-float32 GGUF, which llama.cpp and tacit both read."""
    from tacit.loader.gguf_writer import export_hf_to_gguf

    return export_hf_to_gguf(tiny_llama[2], tmp_path_factory.mktemp("kld_gguf") / "tiny.gguf")


def gguf_chunks(path, max_tokens: int, context: int) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(path), dtype="float32")
    return llm, chunk_ids(llm.get_tokenizer().encode(default_text())[:max_tokens], context)


def test_llamacpp_scores_match_tacit(tiny_gguf):
    """llama.cpp on the same float32 GGUF and ids: with an f32 K/V cache its log-probabilities are
    tacit's to within 1e-4 (measured max |diff| 4e-6); with its default f16 cache, 3e-2 (measured
    4e-3)."""
    pytest.importorskip("llama_cpp")
    from tacit.eval.llamacpp_scores import llamacpp_full_logprobs

    llm, chunks = gguf_chunks(tiny_gguf, 70, 32)
    assert [len(c) for c in chunks] == [32, 32, 6]
    expect = llm.score_full_logprobs(chunks)
    for kv_cache_f32, tol in ((True, 1e-4), (False, 3e-2)):
        got = llamacpp_full_logprobs(tiny_gguf, chunks, 32, threads=2, kv_cache_f32=kv_cache_f32)
        assert [g.shape for g in got] == [e.shape for e in expect]
        assert all(g.dtype == torch.float32 for g in got)
        diff = max((g - e).abs().max().item() for g, e in zip(got, expect))
        assert diff < tol, (kv_cache_f32, diff)


def test_llamacpp_vocab_mismatch_is_an_error(tiny_gguf):
    pytest.importorskip("llama_cpp")
    from tacit.eval.llamacpp_scores import iter_llamacpp_full_logprobs

    with pytest.raises(ValueError, match="vocabulary of 384 tokens.*tacit's logits have 500"):
        next(iter_llamacpp_full_logprobs(tiny_gguf, [[1, 2, 3]], 32, threads=1, vocab_size=500))


def test_cli_llamacpp_peer_row(tiny_gguf, tmp_path, capsys):
    pytest.importorskip("llama_cpp")
    out = tmp_path / "kld.json"
    argv = ["eval", "kld", "--model", str(tiny_gguf), "--dtype", "float32", "--peer", "llama.cpp"]
    argv += ["--max-tokens", "64", "--context", "32", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in printed[2:]}
    assert set(rows) == {"tacit", "llama.cpp"}
    data = json.loads(out.read_text())
    assert data["num_tokens"] == 62 and abs(data["kld_mean"]) < 1e-6  # the model against itself
    peer = data["peers"]["llama.cpp"]
    assert "peers" not in peer
    assert peer["num_tokens"] == 62 and peer["ppl_reference"] == data["ppl_reference"]
    assert 0 <= peer["kld_mean"] < 1e-5 and peer["kld_max"] < 1e-5  # measured 1.7e-7, 9.6e-7 (its f16 K/V cache)
    assert peer["top1_agreement"] > 0.95
    assert float(rows["llama.cpp"][1]) == pytest.approx(peer["kld_mean"], abs=1e-6)


def test_peer_without_llama_cpp_says_how_to_install(tiny_gguf, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    assert main(["eval", "kld", "--model", str(tiny_gguf), "--peer", "llama.cpp", "--max-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert "--peer llama.cpp needs llama-cpp-python" in err and "pip install -e '.[bench]'" in err


def test_peer_on_an_hf_directory_is_an_error(tiny_llama, capsys):
    assert main(["eval", "kld", "--model", str(tiny_llama[2]), "--peer", "llama.cpp", "--max-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert "--peer llama.cpp needs --model to be a .gguf file" in err and str(tiny_llama[2]) in err


def test_reference_with_its_own_quantization_drops_the_overrides():
    import argparse

    from tacit.eval.kld import reference_engine_args

    base = dict(vars(argparse.Namespace()))
    ns = argparse.Namespace(
        **base,
        model="m",
        reference=None,
        quantization="int4",
        quantization_overrides="*.o_proj=int8",
        reference_args="quantization=none",
    )
    ref = reference_engine_args(ns)
    assert ref.quantization == "none" and ref.quantization_overrides == {}
    ns.reference_args = "dtype=float32"  # the reference keeps the model's quantization, overrides included
    ref = reference_engine_args(ns)
    assert ref.quantization == "int4" and ref.quantization_overrides == {"*.o_proj": "int8"}
