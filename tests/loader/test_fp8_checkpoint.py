"""FP8 block-scaled checkpoints (loader/fp8_checkpoint.py): DeepSeek-V3's format, written here
from its description (float8_e4m3fn weight, fp32 weight_scale_inv per [bn, bk] block), run
against the same model whose weights are the formula's dequantized values."""

import json
from pathlib import Path

import pytest
import torch
from fp8_checkpoints import formula, write_fp8_checkpoint
from near_ties import assert_same_up_to_near_ties
from safetensors.torch import load_file, save_file

from tacit import LLM, SamplingParams
from tacit.kernels.ggml_quant import FP8_E4M3
from tacit.layers.ggml_linear_method import GGMLLinearMethod
from tacit.layers.moe import FusedMoE
from tacit.loader.fp8_checkpoint import fp8_blocks
from tacit.loader.fp8_writer import quantize_block_fp8

PROMPTS = ["Paris is the capital of", [5, 9, 11, 3, 200]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)


def fp8_layers(llm: LLM) -> tuple[int, int]:
    """(linear layers, MoE stacks) held as FP8_E4M3 blocks."""
    model = llm.engine.model
    linears = sum(
        isinstance(getattr(m, "linear_method", None), GGMLLinearMethod) and m.linear_method.ggml_type == FP8_E4M3
        for m in model.modules()
    )
    stacks = sum((m.w13_type == FP8_E4M3) + (m.w2_type == FP8_E4M3) for m in model.modules() if isinstance(m, FusedMoE))
    return linears, stacks


def moe_layers(llm: LLM) -> int:
    return sum(isinstance(m, FusedMoE) for m in llm.engine.model.modules())


def test_blocks_hold_the_formula_s_values_and_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # 254 finite codes, subnormals and both zeros included
    w = torch.cat([codes, codes[:2]]).view(torch.float8_e4m3fn).reshape(2, 128)
    blocks = fp8_blocks(w, torch.tensor([[0.5, 2.0, 3.0, 0.25]]), (128, 32), "t")
    assert blocks.type_name == "FP8_E4M3" and blocks.data.shape == (2, 4 * 36)
    want = w.float() * torch.tensor([0.5, 2.0, 3.0, 0.25]).repeat_interleave(32)
    assert torch.equal(blocks.dequantize(), want)
    q, scale = quantize_block_fp8(torch.randn(40, 96), [16, 64])  # partial blocks at both edges
    assert torch.equal(fp8_blocks(q, scale, (16, 64), "t").dequantize(), formula(q, scale, [16, 64]))


def test_writer_rounds_each_block_to_e4m3_of_its_max():
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(0))
    w[16:32, 64:] = 0  # an all-zero block: zeros, never NaN
    q, scale = quantize_block_fp8(w, (16, 64))
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 2)
    back = formula(q, scale, (16, 64))
    s = scale.repeat_interleave(16, 0)[:40].repeat_interleave(64, 1)[:, :96]
    # half an e4m3 step: 2^-4 relative for normals (3 mantissa bits), 2^-10 of the scale below 2^-6
    assert ((back - w).abs() <= torch.maximum(w.abs() * 2**-4, s * 2**-10) + 1e-7).all()
    assert torch.isfinite(back).all() and (back[16:32, 64:] == 0).all()
    assert torch.allclose(q.float().abs().amax(), torch.tensor(448.0))  # each block's max is e4m3's largest


def outputs(path: Path, dtype: str, **kwargs):
    llm = LLM(str(path), dtype=dtype, **kwargs)
    return llm.generate(PROMPTS, PARAMS), llm


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe", "deepseek_v3_qlora"])
def test_checkpoint_runs_with_the_formula_s_tokens(tiny_model_factory, tmp_path, arch):
    path, ref_path = write_fp8_checkpoint(tiny_model_factory(arch)[2], tmp_path / arch)
    kept, llm = outputs(path, "float32", quantization="gguf")  # the torch reference of the blocks
    linears, stacks = fp8_layers(llm)
    assert linears > 0 and stacks == 2 * moe_layers(llm)  # every expert stack too
    dequantized, llm = outputs(path, "float32")  # auto in float32: dequantized at load
    assert fp8_layers(llm) == (0, 0)
    ref = outputs(ref_path, "float32")[0]
    for a, b, r in zip(kept, dequantized, ref):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids == r.outputs[0].token_ids
        for la, lb, lr in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, r.outputs[0].logprobs):
            # the same float32 weights all three ways: the blocks hold the formula's values exactly
            assert all(abs(la[t].logprob - lr[t].logprob) < 1e-4 for t in la)
            assert all(abs(lb[t].logprob - lr[t].logprob) < 1e-4 for t in lb)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe_all", "deepseek_v3"])
def test_bf16_kernels_run_the_blocks(tiny_model_factory, tmp_path, arch):
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    if load_cpu_kernels() is None:
        pytest.skip("no AVX512-BF16 CPU kernels here")
    path, ref_path = write_fp8_checkpoint(tiny_model_factory(arch)[2], tmp_path / arch)
    native, llm = outputs(path, "bfloat16")  # auto in bf16: kept as blocks, the kernels run them
    linears, stacks = fp8_layers(llm)
    assert linears > 0 and stacks == 2 * moe_layers(llm)
    ref = outputs(ref_path, "bfloat16")[0]
    # The reference rounds each weight q * s to bf16 (prefill does too: it multiplies the blocks
    # dequantized); the decode GEMV multiplies the exact e4m3 values and scales each block's fp32
    # partial sum instead. On these flat tiny models (top logprob ~ -3) in bf16 the two roundings
    # move logprobs by up to ~0.07 (deepseek_v3, step 6); a wrong scale or decode by whole units.
    assert_same_up_to_near_ties(ref, native, tol=0.15)


def test_bad_checkpoints_are_named(tiny_llama, tmp_path):
    path, _ = write_fp8_checkpoint(tiny_llama[2], tmp_path / "fp8")
    cfg = json.loads((path / "config.json").read_text())
    for change, message in [
        ({"fmt": "e5m2"}, "fmt='e5m2' is not supported; tacit loads e4m3"),
        ({"activation_scheme": "static"}, "activation_scheme='static' is not supported"),
        ({"weight_block_size": None}, "weight_block_size=None; tacit loads block-scaled FP8"),
        ({"weight_block_size": [128, 100]}, "the column block 100 is not a multiple of 32"),
    ]:
        (path / "config.json").write_text(
            json.dumps({**cfg, "quantization_config": {**cfg["quantization_config"], **change}})
        )
        with pytest.raises(ValueError, match=message):
            LLM(str(path), dtype="float32")
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj"
    for edit, message in [
        (lambda t: t.pop(f"{name}.weight_scale_inv"), f"FP8 checkpoint is missing {name}.weight_scale_inv"),
        (
            lambda t: t.update({f"{name}.weight_scale_inv": torch.ones(1, 1)}),
            f"{name}.weight_scale_inv: a .* weight in 16 x 32 blocks needs a float scale of shape",
        ),
        (
            lambda t: t.update(
                {f"{name}.weight": t[f"{name}.weight"].view(torch.uint8).clone().fill_(0x7F).view(torch.float8_e4m3fn)}
            ),
            f"{name}.weight holds a NaN",
        ),
        (
            lambda t: t[f"{name}.weight_scale_inv"].fill_(float("inf")),
            f"{name}.weight_scale_inv holds a value that is not finite",
        ),
    ]:
        broken = dict(tensors)
        broken[f"{name}.weight_scale_inv"] = tensors[f"{name}.weight_scale_inv"].clone()
        edit(broken)
        save_file(broken, str(path / "model.safetensors"))
        with pytest.raises(ValueError, match=message):
            LLM(str(path), dtype="float32")
