"""A GGUF whose matrices are Q4_0/Q4_1/Q5_0/Q8_0, run with its weights kept in their GGML blocks
(quantization="gguf"/"auto") and dequantized at load ("none"): the same greedy tokens.

Both runs multiply by the same bf16-rounded weights in the same fp32 order (ggml_gemv.cpp
walks 32-value blocks as gemv_bf16.cpp walks 32-value chunks), so the tokens agree exactly;
the tiny models' peaked weights (tests/tiny_models.py) keep that robust anyway.
"""

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from near_ties import assert_same_up_to_near_ties

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.kernels.ggml_quant import GGML_TYPES
from tacit.layers.embedding import GGMLEmbedding
from tacit.layers.ggml_linear_method import GGMLLinearMethod
from tacit.loader.gguf_file import GGUFFile
from tacit.loader.gguf_writer import export_hf_to_gguf

KERNELS = cpu_supports_avx512_bf16() and not os.environ.get("TACIT_NO_CPU_KERNELS")
PROMPTS = ["Paris is the capital of", [5, 9, 11, 3, 200], list(range(20, 60))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama_dir(tiny_model_factory):
    return tiny_model_factory("llama")[2]


def export(hf_dir: Path, tmp_path: Path, types: dict[str, str]) -> Path:
    return export_hf_to_gguf(hf_dir, tmp_path / "tiny.gguf", ggml_types=types)


def greedy(path: Path, **kwargs) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(path), **kwargs)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)], llm


def ggml_layers(llm: LLM) -> dict[str, str]:
    return {
        name: m.linear_method.type_name
        for name, m in llm.engine.model.named_modules()
        if isinstance(getattr(m, "linear_method", None), GGMLLinearMethod)
    }


@pytest.mark.skipif(not KERNELS, reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set")
@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "MXFP4"])
def test_native_weights_give_the_dequantized_tokens(tiny_llama_dir, tmp_path, ggml_type, bf16_ggml_activations):
    path = export(tiny_llama_dir, tmp_path, {"": ggml_type})
    native, llm = greedy(path, dtype="bfloat16")  # auto: kept quantized where the kernels run
    layers = ggml_layers(llm)
    # qkv, o, gate_up, down in each of 2 layers, and the (untied) lm_head
    assert len(layers) == 2 * 4 + 1 and set(layers.values()) == {ggml_type} and "lm_head" in layers
    assert llm.engine.runner.fused_decode is not None
    table = llm.engine.model.model.embed_tokens  # the embedding table stays in its blocks too
    assert isinstance(table, GGMLEmbedding) and GGML_TYPES[table.ggml_type].name == ggml_type
    dequantized, ref = greedy(path, dtype="bfloat16", quantization="none")
    assert ggml_layers(ref) == {}
    assert native == dequantized
    weight_bytes = [sum(p.nbytes for p in x.engine.model.model.layers.parameters()) for x in (llm, ref)]
    assert weight_bytes[0] < 0.6 * weight_bytes[1]


@pytest.mark.skipif(not KERNELS, reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set")
@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "MXFP4"])
def test_int8_activations_keep_the_dequantized_tokens_up_to_near_ties(tiny_llama_dir, tmp_path, ggml_type):
    """By default GGML decode rows round activations to int8 per 32 values (llama.cpp's
    arithmetic; so does a prefill of 1-4 rows): on this flat tiny model (top
    logprob ~ -3) that rounding moved logprobs by up to 0.08 (Q4_0, Q8_0) and 0.10 (Q5_0) in the
    first 4 steps, so within 0.15 until a near tie (later steps drift further: each reads KV the
    other rounding wrote)."""
    path = export(tiny_llama_dir, tmp_path, {"": ggml_type})
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    native = LLM(str(path), dtype="bfloat16").generate(PROMPTS, params)
    dequantized = LLM(str(path), dtype="bfloat16", quantization="none").generate(PROMPTS, params)
    assert_same_up_to_near_ties(dequantized, native, tol=0.15)


@pytest.mark.skipif(not KERNELS, reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set")
@pytest.mark.parametrize("override", ["attn_q.weight", "ffn_up.weight"])
def test_merged_shards_of_mixed_types_keep_their_own_blocks(
    tiny_llama_dir, tmp_path, capsys, override, bf16_ggml_activations
):
    """q (or up) in Q8_0 beside Q4_1 k, v (or gate): the merged layer keeps each shard's blocks
    (MixedGGMLLinearMethod), the fused step multiplies each into its own columns, and the
    tokens are the dequantized run's, fused or on the torch path (a 40-token prompt: 9-32 rows
    8 a pass; dequantized past that)."""
    types = {"": "Q4_1", override: "Q8_0", "ffn_down.weight": "Q4_0", "token_embd.weight": "Q8_0"}
    path = export(tiny_llama_dir, tmp_path, types)
    native, llm = greedy(path, dtype="bfloat16")
    assert "mixed" not in capsys.readouterr().err
    merged = "self_attn.qkv_proj" if override == "attn_q.weight" else "mlp.gate_up_proj"
    layers = ggml_layers(llm)
    assert layers[f"model.layers.0.{merged}"] == ("Q8_0/Q4_1/Q4_1" if "attn" in override else "Q4_1/Q8_0")
    assert layers["model.layers.1.mlp.down_proj"] == "Q4_0" and layers["model.layers.1.self_attn.o_proj"] == "Q4_1"
    assert llm.engine.runner.fused_decode is not None
    dequantized = greedy(path, dtype="bfloat16", quantization="none")[0]
    assert native == dequantized
    torch_path = LLM(str(path), dtype="bfloat16")
    torch_path.engine.runner.fused_decode = None
    assert [o.outputs[0].token_ids for o in torch_path.generate(PROMPTS, PARAMS)] == dequantized
    weight = llm.engine.model.model.layers[0].get_submodule(merged).weight
    assert weight.dim() == 1 and weight.dtype == torch.uint8  # the shards' blocks back to back


def test_mixed_shards_on_the_torch_reference(tiny_llama_dir, tmp_path):
    """float32: the torch reference dequantizes each shard of a mixed layer; the same tokens as
    dequantizing the file at load."""
    path = export(tiny_llama_dir, tmp_path, {"": "Q4_1", "attn_v.weight": "Q8_0"})
    native, llm = greedy(path, dtype="float32", quantization="gguf")
    assert ggml_layers(llm)["model.layers.0.self_attn.qkv_proj"] == "Q4_1/Q4_1/Q8_0"
    assert native == greedy(path, dtype="float32", quantization="none")[0]


def test_torch_reference_keeps_blocks_where_no_kernel_runs(tiny_llama_dir, tmp_path):
    """float32 has no kernel: auto dequantizes at load, gguf keeps the blocks on the torch
    reference (dequantize, then the unquantized method's matmul), with the same tokens."""
    path = export(tiny_llama_dir, tmp_path, {"": "Q4_1"})
    auto, llm = greedy(path, dtype="float32")
    assert ggml_layers(llm) == {}
    kept, llm = greedy(path, dtype="float32", quantization="gguf")
    assert set(ggml_layers(llm).values()) == {"Q4_1"} and llm.engine.runner.fused_decode is None
    assert kept == auto


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="quantization='q4' is not supported; valid: auto, gguf, none, int8, int4"):
        LLM(None, quantization="q4")


def _write_q8_0(path: Path, rows: int, cols: int, raw_shape: tuple[int, int] | None = None) -> None:
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, val in [("block_count", 1), ("embedding_length", cols), ("feed_forward_length", rows)]:
        writer.add_uint32(f"llama.{key}", val)
    writer.add_uint32("llama.attention.head_count", 2)
    writer.add_token_list(["a"] * 64)
    q = quantize(np.ones((rows, cols), np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor(
        "blk.0.ffn_gate.weight", q, raw_shape=raw_shape or q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_tensor_bytes_that_do_not_fit_type_and_shape_are_refused(tmp_path):
    # The header says 8 rows, the file holds 4.
    _write_q8_0(tmp_path / "short.gguf", 4, 128, raw_shape=(8, 136))
    with pytest.raises(
        ValueError, match=r"short.gguf: tensor 'blk.0.ffn_gate.weight' data is bytes .* past the file's end"
    ):
        GGUFFile(tmp_path / "short.gguf")
    # The header says rows of 100 values: not whole 32-value Q8_0 blocks.
    _write_q8_0(tmp_path / "odd.gguf", 4, 128)
    data = bytearray((tmp_path / "odd.gguf").read_bytes())
    at = data.index(b"blk.0.ffn_gate.weight") + len("blk.0.ffn_gate.weight")
    assert struct.unpack_from("<IQ", data, at) == (2, 128)
    struct.pack_into("<Q", data, at + 4, 100)
    (tmp_path / "odd.gguf").write_bytes(bytes(data))
    with pytest.raises(
        ValueError, match="tensor .blk.0.ffn_gate.weight. rows of 100 values are not whole 32-value blocks"
    ):
        GGUFFile(tmp_path / "odd.gguf")


@pytest.mark.skipif(not KERNELS, reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set")
def test_tied_head_keeps_the_embedding_blocks(tiny_model_factory, tmp_path, bf16_ggml_activations):
    """Tied embeddings (llama3 tiny: also attention bias): the head multiplies by the Q8_0
    token_embd blocks, the lookup table is the very same tensor (held once), and the tokens
    are unchanged."""
    path = export(tiny_model_factory("llama3")[2], tmp_path, {"": "Q4_1", "token_embd.weight": "Q8_0"})
    native, llm = greedy(path, dtype="bfloat16")
    model = llm.engine.model
    assert ggml_layers(llm)["lm_head"] == "Q8_0" and isinstance(model.model.embed_tokens, GGMLEmbedding)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert native == greedy(path, dtype="bfloat16", quantization="none")[0]


def test_k_quants_stay_in_blocks_and_other_types_dequantize_with_a_message(tmp_path, capsys):
    """The gguf package cannot quantize K-quants, so the file holds random blocks with small
    finite scales; the oracle is the package's dequantize either way."""
    import gguf
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    for key, val in [("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 8)]:
        writer.add_uint32(f"llama.{key}", val)
    writer.add_uint32("llama.attention.head_count", 2)
    writer.add_token_list(["a"] * 64)
    raw = {}
    # (tensor, type, block bytes, where its fp16 scales are: Q4_K/Q5_K d, dmin first; Q6_K d
    # last; Q2_K d, dmin last)
    for name, qtype, block_bytes, (a, b) in [
        ("ffn_gate", "Q4_K", 144, (0, 4)),
        ("ffn_up", "Q6_K", 210, (208, 210)),
        ("ffn_down", "Q5_K", 176, (0, 4)),
        ("attn_output", "Q2_K", 84, (80, 84)),
    ]:
        q = rng.integers(0, 256, size=(8, block_bytes), dtype=np.uint8)
        q[:, a:b] = rng.uniform(0.002, 0.02, size=(8, (b - a) // 2)).astype(np.float16).view(np.uint8)
        raw[name] = (q, gguf.GGMLQuantizationType[qtype])
        writer.add_tensor(f"blk.0.{name}.weight", q, raw_shape=q.shape, raw_dtype=raw[name][1])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = GGUFFile(tmp_path / "k.gguf")
    layer = "model.layers.0.mlp"
    native = [
        ("gate_proj", "ffn_gate", "Q4_K", 12),
        ("up_proj", "ffn_up", "Q6_K", 14),
        ("down_proj", "ffn_down", "Q5_K", 13),
    ]
    assert f.quantized_weights() == {f"{layer}.{name}.weight": t for name, _, _, t in native}
    got = dict(f.tensors())
    for name, gguf_name, type_name, _ in native:
        t = got[f"{layer}.{name}.weight"]
        assert t.type_name == type_name and t.shape == (8, 256)
        assert torch.equal(t.dequantize(), torch.from_numpy(dequantize(*raw[gguf_name])))
    o = got["model.layers.0.self_attn.o_proj.weight"]
    assert isinstance(o, torch.Tensor) and torch.equal(o, torch.from_numpy(dequantize(*raw["attn_output"])))
    err = capsys.readouterr().err
    assert (
        "k.gguf: Q2_K (1 tensors) dequantized at load; native GGML kernels take Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K"
        in err
    )
