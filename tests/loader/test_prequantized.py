"""GPTQ and AWQ 4-bit checkpoints converted at load to Q4_1 blocks (loader/prequantized.py).

The packers below are written from the formats' descriptions, independently of the loader's
unpackers; a hand-packed int32 pins the bit order against the description itself.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tacit import LLM, SamplingParams
from tacit.layers.ggml_linear_method import GGMLLinearMethod
from tacit.loader.prequantized import AWQ_ORDER, convert, unpack_awq, unpack_gptq

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = ["Paris is the capital of", [5, 9, 11, 3, 200]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)


def _int32(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def pack_along_rows(v: torch.Tensor) -> torch.Tensor:
    """[8R, C] of 0..15 -> int32 [R, C]: row 8i + j in bits 4j..4j+3 of row i (GPTQ qweight)."""
    v = v.long().reshape(-1, 8, v.shape[1])
    return _int32(sum(v[:, j] << (4 * j) for j in range(8))).contiguous()


def pack_along_cols(v: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """[R, 8C] -> int32 [R, C]: column 8c + order[i] in bits 4i..4i+3 of column c."""
    v = v.long().reshape(v.shape[0], -1, 8)
    return _int32(sum(v[..., order[i]] << (4 * i) for i in range(8))).contiguous()


def random_layer(k, n, g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.randint(0, 16, (k // g, n), generator=gen)
    scales = (torch.rand(k // g, n, generator=gen) * 0.02 + 0.001).half()
    return q, zeros, scales


def formula(q, zeros, scales):
    g = q.shape[0] // scales.shape[0]
    z, s = zeros.repeat_interleave(g, 0).float(), scales.repeat_interleave(g, 0).float()
    return ((q.float() - z) * s).T  # [N, K]


def test_hand_packed_words_read_as_the_formats_describe():
    word = torch.tensor([[0x76543210]], dtype=torch.int32)
    q, _ = unpack_gptq(word, word)  # GPTQ: along K, value j in bits 4j
    assert q[:, 0].tolist() == list(range(8))
    q, z = unpack_awq(word, word)  # AWQ: along N, bit slot i holds column AWQ_ORDER[i]
    assert q[0].tolist() == z[0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert [AWQ_ORDER.index(n) for n in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]
    high = torch.tensor([[-1]], dtype=torch.int32)  # 0xFFFFFFFF: the sign bit is data
    assert unpack_gptq(high, high)[0].flatten().tolist() == [15] * 8


@pytest.mark.parametrize("k,n,g", [(64, 16, 32), (256, 24, 128), (128, 8, 64)])
def test_unpack_inverts_pack_and_the_blocks_are_the_formula(k, n, g):
    q, zeros, scales = random_layer(k, n, g)
    got_q, got_z = unpack_gptq(pack_along_rows(q), pack_along_cols(zeros))
    assert torch.equal(got_q, q.int()) and torch.equal(got_z, zeros.int())
    got_q, got_z = unpack_awq(pack_along_cols(q, AWQ_ORDER), pack_along_cols(zeros, AWQ_ORDER))
    assert torch.equal(got_q, q.int()) and torch.equal(got_z, zeros.int())
    # GPTQ v1 stores zero - 1: the converter adds it back
    parts = {"qweight": pack_along_rows(q), "qzeros": pack_along_cols((zeros - 1).clamp(min=0)), "scales": scales}
    gptq = convert("gptq", parts, 1, "layer")
    ref = formula(q, (zeros - 1).clamp(min=0) + 1, scales)
    assert gptq.type_name == "Q4_1" and gptq.shape == (n, k)
    # d = scale exactly; m = -zero * scale rounded to fp16: within 2^-11 of |zero * scale|
    bound = formula(torch.zeros_like(q), (zeros - 1).clamp(min=0) + 1, scales).abs() * 2**-11 + 1e-7
    assert ((gptq.dequantize() - ref).abs() <= bound).all()
    parts = {"qweight": pack_along_cols(q, AWQ_ORDER), "qzeros": pack_along_cols(zeros, AWQ_ORDER), "scales": scales}
    awq = convert("awq", parts, 0, "layer")
    bound = formula(torch.zeros_like(q), zeros, scales).abs() * 2**-11 + 1e-7
    assert ((awq.dequantize() - formula(q, zeros, scales)).abs() <= bound).all()


def test_groups_that_are_not_whole_blocks_are_refused():
    q, zeros, scales = random_layer(64, 8, 16)
    parts = {"qweight": pack_along_rows(q), "qzeros": pack_along_cols(zeros), "scales": scales}
    with pytest.raises(ValueError, match="layer: group size 16 is not a multiple of 32"):
        convert("gptq", parts, 1, "layer")


def quantize_rtn(w: torch.Tensor, g: int):
    """[N, K] float -> (q [K, N], zeros [K / g, N], fp16 scales [K / g, N]): asymmetric 4-bit."""
    wt = w.T.float().reshape(-1, g, w.shape[0])  # [G, g, N]
    lo, hi = wt.amin(1).clamp(max=0), wt.amax(1).clamp(min=0)
    scales = ((hi - lo) / 15).clamp(min=1e-4).half()
    zeros = torch.round(-lo / scales.float()).clamp(0, 15)
    q = (torch.round(wt / scales.float().unsqueeze(1)) + zeros.unsqueeze(1)).clamp(0, 15)
    return q.reshape(w.shape[1], w.shape[0]).long(), zeros.long(), scales


def write_checkpoint(src: Path, dst: Path, method: str, g: int = 32) -> tuple[Path, Path]:
    """(the tiny model as a `method` checkpoint, the same model with those layers' weights
    replaced by the formula's dequantized values)."""
    ref = dst.with_name(dst.name + "_ref")
    for d in (dst, ref):
        d.mkdir()
        for f in src.iterdir():
            if f.suffix != ".safetensors":
                shutil.copy(f, d / f.name)
    tensors = load_file(str(src / "model.safetensors"))
    packed, plain = {}, dict(tensors)
    for name, w in tensors.items():
        prefix, _, kind = name.rpartition(".")
        if kind != "weight" or prefix.rsplit(".", 1)[-1] not in LINEARS:
            packed[name] = w
            continue
        q, zeros, scales = quantize_rtn(w, g)
        if method == "gptq":
            zeros = zeros.clamp(min=1)  # v1 stores zero - 1, so a zero of 0 has no 4-bit code
            packed[f"{prefix}.qweight"] = pack_along_rows(q)
            packed[f"{prefix}.qzeros"] = pack_along_cols(zeros - 1)
            packed[f"{prefix}.g_idx"] = torch.arange(w.shape[1], dtype=torch.int32) // g
        else:
            packed[f"{prefix}.qweight"] = pack_along_cols(q, AWQ_ORDER)
            packed[f"{prefix}.qzeros"] = pack_along_cols(zeros, AWQ_ORDER)
        packed[f"{prefix}.scales"] = scales
        plain[name] = formula(q, zeros, scales).contiguous()
    save_file(packed, str(dst / "model.safetensors"))
    save_file(plain, str(ref / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    quant = {"quant_method": method, "bits": 4, "group_size": g}
    quant.update({"desc_act": False, "sym": False} if method == "gptq" else {"version": "gemm", "zero_point": True})
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    return dst, ref


def ggml_types(llm: LLM) -> set[str]:
    return {
        m.linear_method.type_name
        for m in llm.engine.model.modules()
        if isinstance(getattr(m, "linear_method", None), GGMLLinearMethod)
    }


def outputs(path: Path, **kwargs):
    llm = LLM(str(path), dtype="float32", **kwargs)
    return llm.generate(PROMPTS, PARAMS), llm


@pytest.mark.parametrize("method,g", [("gptq", 32), ("awq", 64)])
def test_checkpoint_runs_as_q4_1_with_the_formula_s_tokens(tiny_llama, tmp_path, method, g):
    path, ref_path = write_checkpoint(tiny_llama[2], tmp_path / method, method, g)
    kept, llm = outputs(path, quantization="gguf")
    assert ggml_types(llm) == {"Q4_1"} and llm.engine.model.lm_head.weight.dtype == torch.float32
    dequantized, llm = outputs(path)  # auto in float32: dequantized at load, as a GGUF's blocks
    assert ggml_types(llm) == set()
    ref = outputs(ref_path)[0]
    for a, b, r in zip(kept, dequantized, ref):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids == r.outputs[0].token_ids
        for la, lb, lr in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, r.outputs[0].logprobs):
            # kept and dequantized-at-load: the same float32 weights
            assert all(abs(la[t].logprob - lb[t].logprob) < 1e-5 for t in la)
            # against the formula: m = -zero * scale rounded to fp16 moves logprobs by ~1e-3 here
            assert all(abs(la[t].logprob - lr[t].logprob) < 1e-2 for t in la)


def test_unsupported_settings_are_named(tiny_llama, tmp_path):
    path, _ = write_checkpoint(tiny_llama[2], tmp_path / "g", "gptq")
    with pytest.raises(ValueError, match="int8/int4 quantize an unquantized Hugging Face checkpoint at load; .* use"):
        LLM(str(path), dtype="float32", quantization="int8")
    with pytest.raises(ValueError, match="weights are quantized \\(GPTQ / AWQ / FP8 / GGUF\\); only an unquantized"):
        LLM(str(path), dtype="float32", expert_cache_memory=1 << 20)
    cfg = json.loads((path / "config.json").read_text())
    for change, message in [
        ({"desc_act": True}, "desc_act=true \\(act-order\\) is not supported"),
        ({"bits": 8}, "bits=8; tacit loads 4-bit gptq checkpoints only"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not supported; tacit loads gptq and awq"),
        ({"quant_method": "awq", "version": "gemv"}, "AWQ version 'gemv' is not supported"),
        ({"quant_method": "awq", "zero_point": False}, "zero_point=false \\(no qzeros\\) is not supported"),
    ]:
        (path / "config.json").write_text(
            json.dumps({**cfg, "quantization_config": {**cfg["quantization_config"], **change}})
        )
        with pytest.raises(ValueError, match=message):
            LLM(str(path), dtype="float32")
