import numpy as np
import pytest

from tacit import LLM, SamplingParams
from tacit.loader.default_model import default_model_path
from tacit.loader.gguf_writer import export_hf_to_gguf, reencode_gguf


@pytest.fixture(scope="module")
def gguf_pair(tiny_model_factory, tmp_path_factory):
    model, tok, path = tiny_model_factory("llama")
    gguf_path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    export_hf_to_gguf(path, gguf_path)
    return path, gguf_path


def test_gguf_matches_hf_directory(gguf_pair):
    hf_dir, gguf_path = gguf_pair
    prompts = ["Paris is the capital of", "Grüße aus München 🙂", [5, 9, 11, 3, 200]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    a = LLM(str(hf_dir), dtype="float32").generate(prompts, params)
    b = LLM(str(gguf_path), dtype="float32").generate(prompts, params)
    for x, y in zip(a, b):
        assert x.prompt_token_ids == y.prompt_token_ids  # the tokenizer rebuilt from GGUF metadata agrees
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert x.outputs[0].text == y.outputs[0].text


def test_gguf_chat_template_and_eos(gguf_pair):
    _, gguf_path = gguf_pair
    llm = LLM(str(gguf_path), dtype="float32")
    ids = llm.chat_prompt_ids([{"role": "user", "content": "hi"}])
    tok = llm.get_tokenizer()
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [tok.eos_token_id]
    assert set(llm.engine.config.model.eos_token_ids) == {tok.eos_token_id}


def test_quantized_tensor_dequantizes_close(tmp_path):
    import gguf
    from gguf.quants import quantize

    from tacit.loader.gguf_file import GGUFFile

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    for key, val in [
        ("block_count", 1),
        ("embedding_length", 128),
        ("feed_forward_length", 64),
        ("attention.head_count", 2),
        ("context_length", 64),
    ]:
        writer.add_uint32(f"llama.{key}", val)
    writer.add_token_list(["a"] * 64)
    q = quantize(w, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.ffn_gate.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ((name, tensor),) = list(GGUFFile(tmp_path / "q.gguf").tensors())
    assert name == "model.layers.0.mlp.gate_proj.weight"
    assert tensor.shape == (64, 128) and tensor.type_name == "Q8_0"  # kept in its blocks
    assert np.abs(tensor.dequantize().numpy() - w).max() < 0.02 * np.abs(w).max()


def test_unknown_gguf_architecture_lists_supported(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ValueError, match="'mamba' is not supported; supported: deepseek2, gpt-oss, llama, qwen2, qwen3, qwen3moe"
    ):
        LLM(str(tmp_path / "x.gguf"))


def test_reencoded_gguf_keeps_tokens(gguf_pair, tmp_path):
    _, gguf_path = gguf_pair
    bf16 = reencode_gguf(gguf_path, tmp_path / "bf16.gguf", bf16=True)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    a = LLM(str(gguf_path), dtype="bfloat16").generate(["Paris is the capital of"], params)[0]
    b = LLM(str(bf16), dtype="bfloat16").generate(["Paris is the capital of"], params)[0]
    assert a.prompt_token_ids == b.prompt_token_ids
    assert a.outputs[0].token_ids == b.outputs[0].token_ids  # bf16 storage of bf16-run weights is lossless


@pytest.mark.skipif(not default_model_path().exists(), reason="default model not fetched (run: tacit fetch)")
def test_default_model_answers_a_factual_question():
    llm = LLM(dtype="bfloat16")
    out = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0.0, max_tokens=24)
    )
    assert "Paris" in out[0].outputs[0].text
    assert out[0].outputs[0].finish_reason == "stop"


def test_header_reader_agrees_with_the_gguf_package(gguf_pair, tmp_path):
    """tacit's one-pass header parser (loader/gguf_header.py) against gguf.GGUFReader: every
    field, every tensor's name, type, shape and bytes."""
    import gguf

    from tacit.loader.gguf_header import GGUFHeader

    _, path = gguf_pair
    ours, ref = GGUFHeader(path), gguf.GGUFReader(str(path))
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}  # the reader's own header entries
    assert set(ours.fields) == set(fields) and ours.version == ref.fields["GGUF.version"].contents()
    for key, field in fields.items():
        want = field.contents()
        got = ours.fields[key]
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for t, r in zip(ours.tensors, ref.tensors):
        assert t.ggml_type == int(r.tensor_type) and t.dims == tuple(int(d) for d in r.shape)
        assert np.array_equal(np.asarray(ours.data(t)).view(np.uint8), np.asarray(r.data).view(np.uint8))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:5000])  # inside the vocabulary
    with pytest.raises(ValueError, match="GGUF header runs past the file's end"):
        GGUFHeader(cut)


def test_the_file_is_unmapped_once_its_tensors_are_copied_out(gguf_pair):
    from tacit.loader.gguf_file import GGUFFile

    def mapped(path) -> bool:
        return any(line.rstrip().endswith(str(path.resolve())) for line in open("/proc/self/maps"))

    gguf = GGUFFile(gguf_pair[1])
    tensors = gguf.tensors()
    next(tensors)
    assert mapped(gguf_pair[1])  # read through one read-only mapping while loading
    rest = list(tensors)
    assert rest and not mapped(gguf_pair[1])  # its pages no longer count in the RSS
