"""Precision in `tacit predict`: bytes per value of each weight format from its block layout,
the peak a GEMM runs at from its weight and activation dtypes, and the lm_head / kv_b dtypes a
checkpoint's quantization_config fixes."""

from __future__ import annotations

import pytest

from tacit.cli import main
from tacit.perf_model.dtypes import activation_dtype, resolve_weight_format, weight_bytes_per_value
from tacit.perf_model.memory import weight_bytes
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.operators import Parallel, StepShape, step_ops
from tacit.perf_model.predict import Workload, predict
from tacit.platforms.hardware_table import get_hardware_spec

HALF = 2  # bytes of an fp16 scale / min (ggml_half)


@pytest.mark.parametrize(
    "fmt, nbytes, values",
    [
        # ggml-common.h: block_q8_0 = {half d; int8 qs[32]}
        ("q8_0", HALF + 32, 32),
        # block_q4_0 = {half d; uint8 qs[16]}; block_q4_1 adds half m
        ("q4_0", HALF + 32 // 2, 32),
        ("q4_1", 2 * HALF + 32 // 2, 32),
        # block_q5_0 = {half d; uint8 qh[4]; uint8 qs[16]}; block_q5_1 adds half m
        ("q5_0", HALF + 4 + 16, 32),
        ("q5_1", 2 * HALF + 4 + 16, 32),
        # k-quants over QK_K = 256: q2_K {scales[16], qs[64], d, dmin}
        ("q2_k", 256 // 16 + 256 // 4 + 2 * HALF, 256),
        # q3_K {hmask[32], qs[64], scales[12], d}
        ("q3_k", 256 // 8 + 256 // 4 + 12 + HALF, 256),
        # q4_K {d, dmin, scales[12], qs[128]} = 144 bytes
        ("q4_k", 2 * HALF + 12 + 128, 256),
        # q5_K: q4_K and qh[32] = 176
        ("q5_k", 2 * HALF + 12 + 32 + 128, 256),
        # q6_K {ql[128], qh[64], int8 scales[16], d} = 210
        ("q6_k", 128 + 64 + 16 + HALF, 256),
        # iq4_xs {d, scales_h (uint16), scales_l[4], qs[128]} = 136
        ("iq4_xs", HALF + 2 + 4 + 128, 256),
        # iq4_nl {d, qs[16]}; iq3_s {d, qs[64], qh[8], signs[32], scales[4]} = 110
        ("iq4_nl", HALF + 16, 32),
        ("iq3_s", HALF + 64 + 8 + 32 + 4, 256),
        # iq3_xxs {d, qs[96]}; iq2_s {d, qs[64], qh[8], scales[8]}
        ("iq3_xxs", HALF + 96, 256),
        ("iq2_s", HALF + 64 + 8 + 8, 256),
        # iq2_xs {d, uint16 qs[32], scales[8]}; iq2_xxs {d, uint16 qs[32]}: 2.0625 bits a value
        ("iq2_xs", HALF + 64 + 8, 256),
        ("iq2_xxs", HALF + 64, 256),
        # iq1_m {qs[32], qh[16], scales[8]}; iq1_s {d, qs[32], uint16 qh[8]}
        ("iq1_m", 32 + 16 + 8, 256),
        ("iq1_s", HALF + 32 + 16, 256),
        # ternary: tq2_0 {qs[64], d}; tq1_0 {qs[48], qh[4], d}
        ("tq2_0", 64 + HALF, 256),
        ("tq1_0", 48 + 4 + HALF, 256),
        # ik_llama.cpp's iq2_kl {scales_h (uint16), scales_l[4], qs[64], qh[16]}: 2.6875 bits
        ("iq2_kl", 2 + 4 + 64 + 16, 256),
        # OCP MXFP4: 32 e2m1 values in 16 bytes, one e8m0 scale byte
        ("mxfp4", 16 + 1, 32),
        # e4m3 with a float32 scale per 128x128 block
        ("fp8", 128 * 128 + 4, 128 * 128),
        # W4A16: int4 in groups of 128, an fp16 scale a group (symmetric)
        ("w4a16", 128 // 2 + HALF, 128),
        # AWQ / GPTQ: and a 4-bit zero point a group (qzeros packs 8 in an int32)
        ("awq", 128 // 2 + HALF + 0.5, 128),
        ("gptq", 128 // 2 + HALF + 0.5, 128),
        # tacit's own int8 is Q8_0, its int4 Q4_1
        ("int8", HALF + 32, 32),
        ("int4", 2 * HALF + 16, 32),
    ],
)
def test_bytes_per_value_from_the_block_layout(fmt, nbytes, values):
    assert weight_bytes_per_value(fmt) == pytest.approx(nbytes / values, rel=1e-12)


def test_per_channel_scales_and_ggml_mixes():
    # one float32 scale per output channel: 4 bytes per row of K values
    assert weight_bytes_per_value("w8a8_int8", row=7168) == 1 + 4 / 7168
    assert weight_bytes_per_value("w8a8_fp8", row=4096) == 1 + 4 / 4096
    q4k, q6k, q5k = 144 / 256, 210 / 256, 176 / 256
    # Q4_K_M: ffn_down at Q6_K on llama.cpp's use_more_bits layers. Of 32: the first and last
    # n/8 = 4 (0-3, 28-31) and every third between, i - 4 = 2 mod 3 (6, 9, ..., 27: 8): 16
    assert weight_bytes_per_value("q4_k_m", role="ffn_down", layers=32) == (16 * q6k + 16 * q4k) / 32
    assert weight_bytes_per_value("q4_k_m", role="", layers=32) == q4k  # gate, up, q, k: the default
    assert weight_bytes_per_value("q4_k_m", role="output") == q6k  # output.weight at Q6_K
    assert weight_bytes_per_value("q8_0", role="output") == 34 / 32  # ... except in a Q8_0 file
    # Q3_K_M: attn_v Q5_K on the first 2 layers, Q4_K after
    assert weight_bytes_per_value("q3_k_m", role="attn_v", layers=8) == (2 * q5k + 6 * q4k) / 8
    # llama-quantize's Q2_K is a mix too: ffn_down at Q3_K, not the Q2_K block's 84 bytes a 256
    assert weight_bytes_per_value("q2_k", role="ffn_down", layers=8) == (256 // 8 + 256 // 4 + 12 + HALF) / 256
    assert weight_bytes_per_value("q2_k", role="", layers=8) == (16 + 64 + 2 * HALF) / 256


def _gemm(preds, name):
    return next(t for t in preds if t.op.name == name)


def test_gemm_peak_follows_weights_and_activations():
    shape = shape_from_hf(load_hf_config("Llama-3.1-8B"))
    a100, h100 = get_hardware_spec("a100-80g"), get_hardware_spec("h100-sxm")
    # W8A8 int8: the int8 tensor cores, 624 TOPS on an A100 where bf16 is 312
    w8a8 = _gemm(predict(shape, a100, Workload(8, 512, 8, "w8a8_int8")).prefill_ops, "qkv_proj")
    assert w8a8.op.act_dtype == "int8" and w8a8.peak_flops == a100.flops["int8"].value
    # block fp8 on an A100 (no fp8 units): W8A16, bf16 rows at the bf16 peak; on an H100 W8A8 at fp8's
    fp8_a100 = _gemm(predict(shape, a100, Workload(8, 512, 8, "fp8")).prefill_ops, "qkv_proj")
    fp8_h100 = _gemm(predict(shape, h100, Workload(8, 512, 8, "fp8")).prefill_ops, "qkv_proj")
    assert fp8_a100.op.act_dtype == "bf16" and fp8_a100.peak_flops == a100.flops["bf16"].value
    assert fp8_h100.op.act_dtype == "fp8" and fp8_h100.peak_flops == h100.flops["fp8"].value
    # the A100's bf16 rows are 2 bytes an input value, the H100's fp8 rows 1: 8*512 rows of K=4096
    assert fp8_a100.op.bytes - fp8_h100.op.bytes == shape.num_layers * 8 * 512 * 4096
    # --activation-dtype bf16 turns W8A8 int8 into W8A16
    w8a16 = _gemm(predict(shape, a100, Workload(8, 512, 8, "w8a8_int8", activation_dtype="bf16")).prefill_ops, "o_proj")
    assert w8a16.peak_flops == a100.flops["bf16"].value
    # the lm_head stays bf16 beside int8 linears: bf16 weights, bf16 peak
    head = _gemm(predict(shape, a100, Workload(8, 512, 8, "w8a8_int8")).prefill_ops, "lm_head")
    assert head.op.weight_dtype == "bf16" and head.peak_flops == a100.flops["bf16"].value


def test_activation_dtype_refusals():
    with pytest.raises(ValueError, match="activation dtype 'fp4' is not known; valid: auto, bf16, fp16, fp8, int8"):
        activation_dtype("w8a8_int8", "fp4")
    with pytest.raises(ValueError, match="needs 8-bit or narrower weights"):
        activation_dtype("bf16", "fp8")
    with pytest.raises(ValueError, match="no kernel's pairing; valid: int8, bf16, fp16"):
        activation_dtype("w8a8_int8", "fp8")


MLA = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "q_lora_rank": 0,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
W8A8 = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True},
        }
    },
}


def _dtypes(config: dict, quantization: str) -> dict[str, str]:
    s = shape_from_hf(config)
    ops = {o.name: o for o in step_ops(s, StepShape(1, 4, 0), weight_dtype=quantization)}
    decode = {o.name: o for o in step_ops(s, StepShape(1, 1, 4), weight_dtype=quantization)}
    return {
        "head": ops["lm_head"].weight_dtype,
        "kv_b": ops["kv_b_proj"].weight_dtype,
        "kv_b_absorbed": decode["kv_b_absorbed"].weight_dtype,
        "q": ops["q_proj"].weight_dtype,
    }


def test_the_head_and_kv_b_follow_the_checkpoint():
    # DeepSeek-V3's fp8 config excludes nothing: kv_b_proj is stored fp8; the head is never
    # converted by HF's fp8 quantizer
    ds = {**MLA, "quantization_config": FP8}
    assert shape_from_hf(ds).weight_format == "fp8"
    assert _dtypes(ds, "fp8") == {"head": "bf16", "kv_b": "fp8", "kv_b_absorbed": "fp8", "q": "fp8"}
    excluded = {**MLA, "quantization_config": {**FP8, "modules_to_not_convert": ["kv_b_proj", "lm_head"]}}
    assert _dtypes(excluded, "fp8") == {"head": "bf16", "kv_b": "bf16", "kv_b_absorbed": "bf16", "q": "fp8"}
    # compressed-tensors quantizes every Linear its ignore list leaves, the head included
    ct = {**MLA, "quantization_config": W8A8}
    assert shape_from_hf(ct).weight_format == "w8a8_int8"
    assert _dtypes(ct, "w8a8_int8")["head"] == "w8a8_int8"
    ignored = {**MLA, "quantization_config": {**W8A8, "ignore": ["lm_head", "re:.*kv_b_proj$"]}}
    assert _dtypes(ignored, "w8a8_int8") == {
        "head": "bf16",
        "kv_b": "bf16",
        "kv_b_absorbed": "bf16",
        "q": "w8a8_int8",
    }
    # --quantization on an unquantized checkpoint: the engine's rule, head bf16; tacit's own
    # int8 keeps kv_b bf16 (read directly), an online fp8 quantizes it as vLLM does
    assert _dtypes(MLA, "int8") == {"head": "bf16", "kv_b": "bf16", "kv_b_absorbed": "bf16", "q": "int8"}
    assert _dtypes(MLA, "fp8") == {"head": "bf16", "kv_b": "fp8", "kv_b_absorbed": "fp8", "q": "fp8"}
    # a llama.cpp file: attn_kv_b in its attn_v rule, output.weight Q6_K
    assert _dtypes({**MLA, "hidden_size": 256}, "q4_k_m") == {
        "head": "q6_k",
        "kv_b": "q4_k_m",
        "kv_b_absorbed": "q4_k_m",
        "q": "q4_k_m",
    }


def test_memory_prices_each_tensor_in_its_own_dtype():
    ds, excluded = (
        shape_from_hf({**MLA, "quantization_config": q})
        for q in (FP8, {**FP8, "modules_to_not_convert": ["kv_b_proj"]})
    )
    kv_b_params = 2 * 32 * 4 * (16 + 16)  # layers * kv_lora_rank * heads * (nope + v)
    fp8 = 1 + 4 / (128 * 128)
    assert weight_bytes(excluded, Parallel(), "fp8") - weight_bytes(ds, Parallel(), "fp8") == pytest.approx(
        kv_b_params * (2 - fp8)
    )
    # a quantized head: the w8a8 checkpoint that keeps lm_head is 1000 x 64 values of 2 - ~1 bytes bigger
    ct, ct_ignored = (shape_from_hf({**MLA, "quantization_config": q}) for q in (W8A8, {**W8A8, "ignore": ["lm_head"]}))
    delta = weight_bytes(ct_ignored, Parallel(), "w8a8_int8") - weight_bytes(ct, Parallel(), "w8a8_int8")
    assert delta == pytest.approx(1000 * 64 * (2 - (1 + 4 / 4096)))


@pytest.mark.parametrize(
    "flag, value, listed",
    [
        ("--quantization", "int3", "q4_k_m"),
        ("--activation-dtype", "fp4", "auto, bf16, fp16, fp8, int8"),
    ],
)
def test_a_bad_precision_flag_lists_the_valid_names(flag, value, listed, capsys):
    assert main(["predict", "--model", "Llama-3.1-8B", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {value!r} is not known; valid:" in err and listed in err


def test_auto_prices_the_checkpoints_own_format(capsys):
    assert main(["predict", "--model", "DeepSeek-V3", "--hardware", "a100-80g", "--tensor-parallel-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "weights fp8, activations bf16" in out  # no fp8 units: W8A16


def test_a_gguf_files_types_are_its_checkpoint_dtypes():
    from tacit.perf_model.checkpoint_dtypes import checkpoint_dtypes, gguf_quantization

    # llama.h: general.file_type 15 = MOSTLY_Q4_K_M; ggml.h: output.weight type 14 = Q6_K
    q4km = gguf_quantization({"general.file_type": 15}, {"output.weight": 14, "blk.0.ffn_down.weight": 12})
    assert checkpoint_dtypes(q4km, 32) == ("q4_k_m", "", "q6_k", "")
    # MXFP4_MOE (38): experts MXFP4 (type 39), the rest Q8_0; tacit's gpt-oss files carry no file type
    assert checkpoint_dtypes(gguf_quantization({"general.file_type": 38}, {"blk.0.ffn_down_exps.weight": 39}), 2)[
        :2
    ] == (
        "q8_0",
        "mxfp4",
    )
    assert checkpoint_dtypes(gguf_quantization({}, {"blk.0.ffn_down_exps.weight": 39, "output.weight": 30}), 2) == (
        "",
        "mxfp4",
        "",
        "",
    )
    # a file type tacit does not price: auto asks for --quantization
    odd = {**MLA, "quantization_config": gguf_quantization({"general.file_type": 19}, {})}
    with pytest.raises(ValueError, match="'gguf file type 19' is not one tacit prices; pass --quantization"):
        step_ops(
            shape_from_hf(odd), StepShape(1, 1, 4), weight_dtype=resolve_weight_format("auto", "gguf file type 19")
        )


def test_q6_k_head_falls_back_to_q8_0_when_the_rows_are_no_whole_blocks():
    # llama-quant.cpp's tensor_type_fallback: Q6_K needs a multiple of 256 columns (SmolLM2: 576)
    narrow = shape_from_hf({**MLA, "hidden_size": 576, "num_attention_heads": 4})
    wide = shape_from_hf({**MLA, "hidden_size": 512})
    assert (narrow.tensor_dtypes("q4_k_m").head, wide.tensor_dtypes("q4_k_m").head) == ("q8_0", "q6_k")


def test_the_block_table_agrees_with_the_engines_kernels():
    """ggml_mixes keeps the types llama.cpp's files hold; the ones tacit's kernels also run
    (kernels/ggml_quant.GGML_TYPES) must have the same ids, block bytes and values."""
    from tacit.kernels.ggml_quant import GGML_TYPES
    from tacit.perf_model.checkpoint_dtypes import GGML_TYPE_NAMES
    from tacit.perf_model.ggml_mixes import GGML_BLOCKS

    shared = [t for t in GGML_TYPES.values() if t.name.lower() in GGML_BLOCKS]
    assert len(shared) == 7  # Q4_0 Q4_1 Q5_0 Q8_0 Q4_K Q5_K Q6_K
    for t in shared:
        assert GGML_BLOCKS[t.name.lower()] == (t.block_bytes, t.block_values), t.name
        assert GGML_TYPE_NAMES[t.id] == t.name.lower()


def test_float32_is_priced_as_the_cpu_engine_runs_it():
    """An AVX2-only CPU's engine computes in float32: 4-byte weights, activations and KV rows,
    the lm_head in float32 too, and the part's own fp32 peak."""
    from tacit.perf_model.dtypes import activation_bytes, kv_bytes_per_row, normalize_dtype, tensor_dtypes

    assert normalize_dtype("float32") == "fp32" and weight_bytes_per_value("fp32") == 4
    assert activation_dtype("fp32") == "fp32" and activation_bytes("fp32") == 4
    assert kv_bytes_per_row("fp32", 128) == 4 * 128
    assert tensor_dtypes("fp32").head == tensor_dtypes("fp32").embedding == "fp32"
    assert tensor_dtypes("int8").head == "bf16"  # a quantized engine keeps its head bf16
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    bf16, fp32 = (weight_bytes(shape, Parallel(), dt) for dt in ("bf16", "fp32"))
    assert fp32 == pytest.approx(2 * bf16, rel=1e-6)


def test_float32_needs_a_part_that_states_its_fp32_peak():
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    with pytest.raises(ValueError, match="states an fp32 peak.*h100-sxm has only"):
        predict(shape, get_hardware_spec("h100-sxm"), Workload(1, 16, 4, "fp32", "fp32"))


def test_fitted_roofs_keep_the_fp32_peak_of_a_bf16_fit():
    """A bf16 fit's stored peak prices bf16 and int8; float32 keeps this process's own figure
    (an AMX CPU's float32 matmul is far slower), unless the fit itself is float32."""
    from dataclasses import replace

    from tacit.perf_model.efficiency import load_profile
    from tacit.perf_model.predict import fitted_roofs
    from tacit.platforms.specs import Sourced

    spec = replace(
        get_hardware_spec("h100-sxm"),
        name="this-cpu",
        flops={"bf16": Sourced(1e12, "t"), "int8": Sourced(1e12, "t"), "fp32": Sourced(1e11, "t")},
    )
    profile = replace(load_profile("nvidia-hopper"), roofs={"bf16_flops": 2e12, "read_bandwidth": 3e10})
    fitted = fitted_roofs(spec, profile)
    assert (fitted.peak_flops("bf16"), fitted.peak_flops("fp32")) == (2e12, 1e11)
    fitted = fitted_roofs(spec, replace(profile, compute_dtype="fp32"))
    assert fitted.peak_flops("fp32") == 2e12 and fitted.memory_bandwidth.value == 3e10


def test_this_cpu_prices_an_unquantized_model_in_the_engines_dtype(monkeypatch):
    """`--quantization auto` on this-cpu is the engine's --dtype auto (float32 without a native
    bf16 matmul), with an auto KV cache in float32 too, and so is a GGUF there without the C++
    kernels; a format asked for is kept."""
    from dataclasses import replace

    from tacit.perf_model import fit_host

    monkeypatch.setattr(fit_host, "host_precision", lambda: fit_host.HostPrecision("fp32", kernels=False))
    gpu = get_hardware_spec("h100-sxm")
    cpu = replace(gpu, name="this-cpu")
    priced = fit_host.priced_dtypes
    assert priced(cpu, "auto", "auto", "") == ("fp32", "fp32")
    assert priced(cpu, "auto", "int8", "") == ("fp32", "int8")
    assert priced(cpu, "bf16", "auto", "") == ("bf16", "bf16")
    assert priced(cpu, "auto", "auto", "fp8") == ("fp8", "bf16")
    assert priced(cpu, "auto", "auto", "q8_0") == ("fp32", "fp32")  # no kernels: the GGUF dequantized at load
    assert priced(cpu, "q8_0", "auto", "q8_0") == ("q8_0", "bf16")
    assert priced(cpu, "none", "auto", "q8_0") == ("fp32", "fp32")
    assert priced(gpu, "auto", "auto", "") == ("bf16", "bf16")
    with pytest.raises(ValueError, match="--kv-cache-dtype 'fp6' is not known"):
        priced(cpu, "auto", "fp6", "")


@pytest.mark.parametrize(
    ("weights", "act", "hardware"),
    [("int4", "int8", "ascend-910c-die"), ("w8a8_int8", "bf16", "h100-sxm"), ("fp8", "auto", "a100-80g")],
    ids=["w4a8", "w8a16", "block-fp8-without-fp8-units"],
)
def test_the_mixed_step_prices_the_activations_the_uniform_step_does(weights, act, hardware):
    """TTFT, the serve replay and MTP drafts price steps through Pricing; they once left
    --activation-dtype at auto, so a W4A8 prompt's projections ran at the bf16 peak there and at
    the int8 peak in the uniform step (a DeepSeek-V3 prompt on a 910C die: 521 against 403 ms)."""
    from tacit.perf_model.efficiency import load_profile
    from tacit.perf_model.predict import step_time
    from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_times
    from tests.perf_model.test_counts import MOE

    shape, spec = shape_from_hf(MOE), get_hardware_spec(hardware)
    profile = load_profile(spec.efficiency_profile)
    w = Workload(1, 512, 4, weights, "bf16", 32, Parallel(), activation_dtype=act)
    _, uniform = step_time(shape, spec, profile, w, StepShape(1, 512, 0))
    pricing = Pricing(shape, spec, profile, weights, "bf16", 32, Parallel(), activation_dtype=act)
    assert pricing.activation_dtype == activation_dtype(weights, act, fp8_units="fp8" in spec.flops)
    _, mixed = mixed_step_times(pricing, MixedStep([Chunk(512, 0, True)]))
    gemms = {t.op.name: t for t in uniform if t.op.is_gemm}
    priced = {t.op.name: t for t in mixed if t.op.is_gemm}
    assert gemms.keys() == priced.keys() and gemms
    for name, t in gemms.items():
        assert priced[name].op.act_dtype == t.op.act_dtype, name
        assert priced[name].seconds == pytest.approx(t.seconds, rel=1e-9), name
