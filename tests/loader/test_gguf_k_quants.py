"""A tiny llama saved as GGUF with its linear weights (and lm_head) in Q4_K, Q5_K or Q6_K, run
with the blocks kept (quantization="gguf") and dequantized at load ("none"): the same greedy
tokens (issue 12's "each type gives the same greedy tokens whether run natively or dequantized").

K-quant rows are whole 256-value super-blocks, so the model is 256 wide (tiny_models'
llama_256: hidden 256, intermediate 512). The gguf package cannot quantize K-quants, so the
blocks are random bytes with fp16 scales set so the weights are about zero-mean with the std of
the other tiny models (0.15): w = d * sc * q - dmin * m (Q4_K/Q5_K, q in 0..15 / 0..31, sc and m
in 0..63) is centred by dmin = d * mean(q); Q6_K's w = d * sc * (q - 32) (sc int8) is centred
already. That std keeps the logits peaked, as tests/tiny_models.py explains: the native and the
dequantized runs multiply the same weights, but the bf16 kernels may sum in another order than
the dense path, and only a near-tie could turn that rounding into another token.
"""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from near_ties import assert_same_up_to_near_ties
from test_gguf_quantized import ggml_layers

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels
from tacit.kernels.ggml_quant import GGML_TYPES
from tacit.loader.gguf_writer import export_hf_to_gguf

KERNELS = cpu_supports_avx512_bf16() and not os.environ.get("TACIT_NO_CPU_KERNELS")
PROMPTS = ["Paris is the capital of", [5, 9, 11, 3, 200], list(range(20, 60))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
STD = 0.15
# (fp16 d at byte, fp16 dmin at byte or None, mean of q): where each type keeps its scales
_SCALES = {"Q4_K": (0, 2, 7.5), "Q5_K": (0, 2, 15.5), "Q6_K": (208, None, None)}


def k_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, cols / 256 * block bytes]: random K-quant blocks whose dequantized weights
    have about std STD and mean 0."""
    import gguf
    from gguf.quants import dequantize

    t = gguf.GGMLQuantizationType[qtype]
    nb, size = cols // 256, GGML_TYPES[int(t)].block_bytes
    q = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    d_at, dmin_at, q_mean = _SCALES[qtype]

    def set_scales(d: np.ndarray) -> np.ndarray:
        out = q.copy()
        out[..., d_at : d_at + 2] = d.astype(np.float16)[..., None].view(np.uint8)
        if dmin_at is not None:
            out[..., dmin_at : dmin_at + 2] = (d * q_mean).astype(np.float16)[..., None].view(np.uint8)
        return out.reshape(rows, nb * size)

    u = rng.uniform(0.5, 1.5, size=(rows, nb))
    std = dequantize(set_scales(u), t).std()  # w is linear in (d, dmin): scale both to STD
    return set_scales(u * STD / std)


def k_quant_gguf(hf_dir: Path, dst: Path, qtype: str) -> Path:
    """The tiny model as GGUF: linear weights and output.weight as random `qtype` blocks,
    everything else as the float32 export wrote it."""
    import gguf

    plain = export_hf_to_gguf(hf_dir, dst.with_suffix(".f32.gguf"))
    reader = gguf.GGUFReader(str(plain))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        writer.add_key_value(
            key, field.contents(), vtype, sub_type=field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        )
    rng = np.random.default_rng(0)
    for t in reader.tensors:
        arr = np.asarray(t.data).reshape(tuple(int(d) for d in reversed(t.shape)))
        if t.name == "output.weight" or t.name.rsplit(".", 2)[-2] in LINEAR:
            raw = k_blocks(qtype, *arr.shape, rng)
            writer.add_tensor(t.name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[qtype])
        else:
            writer.add_tensor(t.name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def tiny_256_dir(tiny_model_factory):
    return tiny_model_factory("llama_256")[2]


def greedy(path: Path, **kwargs) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(path), **kwargs)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)], llm


K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_float32_torch_reference_gives_the_dequantized_tokens(tiny_256_dir, tmp_path, qtype):
    """float32: the torch reference dequantizes the kept blocks every call; the same weights
    as dequantizing them once at load, so the same tokens."""
    path = k_quant_gguf(tiny_256_dir, tmp_path / "k.gguf", qtype)
    native, llm = greedy(path, dtype="float32", quantization="gguf")
    layers = ggml_layers(llm)
    # qkv, o, gate_up, down in each of 2 layers, and lm_head
    assert len(layers) == 2 * 4 + 1 and set(layers.values()) == {qtype} and "lm_head" in layers
    dequantized, ref = greedy(path, dtype="float32", quantization="none")
    assert ggml_layers(ref) == {}
    assert native == dequantized
    assert len({tuple(t) for t in native}) > 1  # the prompts do not all decode alike


@pytest.mark.skipif(not KERNELS or load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels")
@pytest.mark.parametrize("qtype", K_QUANTS)
def test_bf16_kernels_give_the_dequantized_tokens(tiny_256_dir, tmp_path, qtype, bf16_ggml_activations):
    path = k_quant_gguf(tiny_256_dir, tmp_path / "k.gguf", qtype)
    native, llm = greedy(path, dtype="bfloat16", quantization="gguf")
    assert set(ggml_layers(llm).values()) == {qtype} and "lm_head" in ggml_layers(llm)
    assert llm.engine.runner.fused_decode is not None
    dequantized, ref = greedy(path, dtype="bfloat16", quantization="none")
    assert ggml_layers(ref) == {}
    assert native == dequantized
    weight_bytes = [sum(p.nbytes for p in x.engine.model.model.layers.parameters()) for x in (llm, ref)]
    assert weight_bytes[0] < 0.6 * weight_bytes[1]
    assert llm.engine.model.lm_head.weight.dtype == torch.uint8


@pytest.mark.skipif(not KERNELS or load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels")
@pytest.mark.parametrize("qtype", K_QUANTS)
def test_int8_activations_keep_the_dequantized_tokens_up_to_near_ties(tiny_256_dir, tmp_path, qtype):
    """By default K-quant decode rows (1-8) round activations to int8 with one scale per 256
    values, llama.cpp's q8_K, and keep each super-block's dot product in integers
    (csrc/ggml_k_quants.h; its arithmetic is pinned exactly in tests/kernels/test_ggml_kernels.py):
    on this model (256-wide rows: one scale per activation row) the rounding moved logprobs by up
    to 0.28-0.37 in 8 steps (0.18-0.25 with a scale per 32 values), so within 0.4, tokens the
    dequantized run's until a near tie."""
    path = k_quant_gguf(tiny_256_dir, tmp_path / "k.gguf", qtype)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    llm = LLM(str(path), dtype="bfloat16")
    assert set(ggml_layers(llm).values()) == {qtype}
    native = llm.generate(PROMPTS, params)
    dequantized = LLM(str(path), dtype="bfloat16", quantization="none").generate(PROMPTS, params)
    assert_same_up_to_near_ties(dequantized, native, tol=0.4)
