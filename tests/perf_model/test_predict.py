"""Behaviour of the model: monotone in the right directions, bad names refused, the CLI's JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tacit.perf_model.memory import weight_bytes
from tacit.perf_model.model_shape import load_hf_config, recipe_config_names, shape_from_hf
from tacit.perf_model.operators import Parallel, StepShape, step_ops
from tacit.perf_model.predict import Workload, predict
from tacit.platforms.hardware_table import get_hardware_spec, hardware_names
from tacit.platforms.specs import HardwareSpec, Sourced, check_spec
from tests.perf_model.test_counts import DENSE, MLA, MOE

SHAPES = [shape_from_hf(c) for c in (DENSE, MOE, MLA)]


def _with_bandwidth(spec: HardwareSpec, factor: float) -> HardwareSpec:
    bw = spec.memory_bandwidth
    return replace(spec, memory_bandwidth=Sourced(bw.value * factor, bw.source))


@pytest.mark.parametrize("shape", SHAPES, ids=["dense", "moe", "mla"])
def test_more_bandwidth_is_never_slower(shape):
    spec = get_hardware_spec("h100-sxm")
    for batch in (1, 16, 256):
        w = Workload(batch, 512, 64)
        slow, fast = predict(shape, spec, w), predict(shape, _with_bandwidth(spec, 2.0), w)
        assert fast.tpot_s <= slow.tpot_s and fast.ttft_s <= slow.ttft_s


@pytest.mark.parametrize("shape", SHAPES, ids=["dense", "moe", "mla"])
def test_larger_batch_never_fewer_tokens_per_step(shape):
    spec = get_hardware_spec("a100-80g")
    rates = [b / predict(shape, spec, Workload(b, 256, 32)).tpot_s for b in (1, 2, 4, 8, 16, 64, 256)]
    assert rates == sorted(rates)


def test_int8_and_int4_never_more_weight_bytes_than_bf16():
    for shape in SHAPES:
        bf16 = weight_bytes(shape, Parallel(), "bf16")
        assert weight_bytes(shape, Parallel(), "int8") <= bf16
        assert weight_bytes(shape, Parallel(), "int4") <= weight_bytes(shape, Parallel(), "int8")
        step = StepShape(4, 1, 100)
        for q in ("int8", "int4", "fp8"):
            assert sum(o.bytes for o in step_ops(shape, step, weight_dtype=q)) <= sum(
                o.bytes for o in step_ops(shape, step)
            )


def test_real_configs_predict_and_big_models_do_not_fit_one_device():
    h200 = get_hardware_spec("h200-sxm")
    names = recipe_config_names()
    assert {"DeepSeek-V3", "Kimi-K2-Instruct", "Qwen3-235B-A22B", "Llama-3.1-8B"} <= set(names)
    small = predict(shape_from_hf(load_hf_config("Llama-3.1-8B")), h200, Workload(1, 1024, 128))
    assert small.fits and 0 < small.tpot_s < small.ttft_s * 10
    # Kimi-K2: ~1T parameters, 2 TB in bf16: no single 141 GB device holds it
    kimi = predict(shape_from_hf(load_hf_config("Kimi-K2-Instruct")), h200, Workload(1, 1024, 128))
    assert not kimi.fits and kimi.memory.weights > 1.5e12


def test_tensor_parallel_adds_link_time_and_splits_memory():
    shape = shape_from_hf(load_hf_config("Llama-3.1-70B"))
    spec = get_hardware_spec("h100-sxm")
    one, four = (
        predict(shape, spec, Workload(8, 1024, 64)),
        predict(shape, spec, Workload(8, 1024, 64, parallel=Parallel(4))),
    )
    assert four.memory.weights < one.memory.weights / 3
    assert any(t.op.op_class == "communication" and t.seconds > 0 for t in four.decode_ops)
    ep = predict(shape_from_hf(load_hf_config("Qwen3-30B-A3B")), spec, Workload(8, 512, 64, parallel=Parallel(4, True)))
    # TP + EP: every rank holds every token, runs its own experts and all-reduces the layer's
    # output, as tacit's engine and vLLM do: no all-to-all (that is DeepEP's, under DP attention)
    names = {t.op.name for t in ep.decode_ops if t.op.op_class == "communication"}
    assert "moe_all_reduce" in names and "moe_all_to_all" not in names


def test_unknown_hardware_and_model_are_refused_with_the_valid_names():
    with pytest.raises(ValueError, match=r"hardware 'tpu-v9' is not known; valid: .*h100-sxm.*this-cpu"):
        get_hardware_spec("tpu-v9")
    with pytest.raises(ValueError, match=r"model 'no-such-model'.*Llama-3.1-8B.*random:qwen3-100m"):
        load_hf_config("no-such-model")
    with pytest.raises(ValueError, match=r"random model 'nope'.*random:qwen3-moe-2b"):
        load_hf_config("random:nope")


def test_every_entry_has_a_source_per_field_and_one_without_is_refused():
    for name in hardware_names():
        if name != "this-cpu":  # measured at run time; its sources are checked by the same check_spec
            check_spec(get_hardware_spec(name))
    spec = get_hardware_spec("a100-80g")
    with pytest.raises(ValueError, match="field memory_bandwidth has no source"):
        check_spec(replace(spec, memory_bandwidth=Sourced(2e12, "")))
    with pytest.raises(ValueError, match=r"field flops\[int8\] has no source"):
        check_spec(replace(spec, flops={**spec.flops, "int8": Sourced(1e15, "  ")}))


def test_cli_json_has_the_keys(tmp_path):
    from tacit.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MOE))
    out = tmp_path / "p.json"
    argv = ["predict", "--model", str(cfg), "--hardware", "h100-sxm", "--batch-size", "4"]
    assert main([*argv, "--input-len", "64", "--output-len", "16", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    old = {"ttft_ms", "tpot_ms", "throughput_tok_s", "memory_per_device_gb", "fits", "bottlenecks"}
    assert old <= set(result)  # the keys readers had before the operator rows and inputs came
    assert result["fits"] is True and result["tpot_ms"] > 0
    assert any(k.startswith("decode experts") for k in result["bottlenecks"])
    assert main(["predict", "--model", str(cfg), "--hardware", "nope"]) == 2
    assert main(["predict", "--model", str(cfg), "--hardware", "h100-sxm", "--quantization", "int3"]) == 2


def test_this_cpu_predicts_with_the_fitted_roofs():
    from tacit.perf_model.efficiency import load_profile
    from tacit.perf_model.predict import fitted_roofs

    profile = load_profile("vm-2vcpu-no-amx-1thread")
    assert profile.roofs, "the fitted profile stores the roofs it was fitted against"
    spec = get_hardware_spec("h100-sxm")
    measured = replace(spec, name="this-cpu")  # stands in for a process's re-measured roofs
    pinned = fitted_roofs(measured, profile)
    assert pinned.memory_bandwidth.value == profile.roofs["read_bandwidth"]
    assert pinned.peak_flops("bf16") == pinned.peak_flops("int8") == profile.roofs["bf16_flops"]
    assert fitted_roofs(spec, profile) is spec  # a named device keeps its datasheet roofs


def test_a_serve_replay_prices_this_cpu_with_the_fitted_roofs_too():
    """The serve simulator and tacit tune's model stage price steps through Pricing, not predict():
    two processes probing different peaks price every step alike on the same fit."""
    from tacit.perf_model.efficiency import load_profile
    from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
    from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_seconds

    profile = load_profile("vm-2vcpu-no-amx-1thread")
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    spec = replace(get_hardware_spec("h100-sxm"), name="this-cpu")
    slower = replace(spec, memory_bandwidth=replace(spec.memory_bandwidth, value=spec.memory_bandwidth.value / 3))
    step = MixedStep([Chunk(300, 0, True), *[Chunk(1, 200 + i, True) for i in range(8)]])
    a, b = (mixed_step_seconds(Pricing(shape, s, profile, "fp32", "fp32"), step) for s in (spec, slower))
    assert a == b > 0
    assert Pricing(shape, spec, profile).spec.memory_bandwidth.value == profile.roofs["read_bandwidth"]
    named = get_hardware_spec("h100-sxm")
    assert Pricing(shape, named, profile).spec is named  # a named device keeps its datasheet roofs


def test_elementwise_curve_by_bytes_and_flat_numbers():
    from tacit.perf_model.efficiency import _curve

    c = _curve({"bytes": [1e6, 1e8], "eff": [0.3, 0.1]})
    assert c(1e3) == 0.3 and c(1e9) == 0.1 and 0.1 < c(1e7) < 0.3
    assert _curve(0.8)(12345) == 0.8  # the stated-assumption profiles give a bare number


def test_each_gemm_takes_its_own_kernels_curve():
    """Fused decode steps use the in-situ curve (fit_decode.py) for their projections, never for
    experts or on the torch path; MLA's absorbed projections use torch's bmm curve."""
    from tacit.perf_model.efficiency import Curve, load_profile
    from tacit.perf_model.roofline import _efficiency

    flat = {k: Curve((1.0,), (v,)) for k, v in (("bf16", 0.5), ("bf16_fused_decode", 0.4), ("bmm", 0.2))}
    profile = replace(load_profile("vm-2vcpu-no-amx-1thread"), gemm=flat)
    dense = _by_name(step_ops(SHAPES[0], StepShape(2, 1, 10)))
    assert _efficiency(dense["qkv_proj"], profile, True, "decode_fused") == 0.4
    assert _efficiency(dense["qkv_proj"], profile, True, "torch") == 0.5
    moe = _by_name(step_ops(SHAPES[1], StepShape(2, 1, 10)))
    assert _efficiency(moe["experts"], profile, True, "decode_fused") == 0.5
    mla = _by_name(step_ops(SHAPES[2], StepShape(2, 1, 10)))
    assert mla["kv_b_absorbed"].kernel == "bmm"
    assert _efficiency(mla["kv_b_absorbed"], profile, True, "torch") == 0.2


def _by_name(ops):
    return {o.name: o for o in ops}


def test_experts_and_prefill_attention_take_their_kernels_curves():
    from tacit.perf_model.efficiency import Curve, load_profile
    from tacit.perf_model.roofline import _efficiency

    gemm = {"bf16": Curve((1.0,), (0.5,)), "int8": Curve((1.0,), (0.6,)), "moe_bf16": Curve((1.0,), (0.3,))}
    by_length = Curve((64.0, 1024.0), (0.03, 0.09))
    profile = replace(
        load_profile("vm-2vcpu-no-amx-1thread"),
        gemm=gemm,
        attention_prefill=by_length,
        attention_prefill_mla=Curve((1.0,), (0.02,)),
    )
    moe = _by_name(step_ops(SHAPES[1], StepShape(2, 1, 10)))
    assert moe["experts"].kernel == "moe" and _efficiency(moe["experts"], profile, True, "decode_fused") == 0.3
    int8 = _by_name(step_ops(SHAPES[1], StepShape(2, 1, 10), weight_dtype="int8"))
    assert _efficiency(int8["experts"], profile, True, "decode_fused") == 0.6  # no int8 experts curve: int8's
    mla = _by_name(step_ops(SHAPES[2], StepShape(1, 64, 0)))
    assert mla["attention"].kernel == "mla" and _efficiency(mla["attention"], profile, False, "torch") == 0.02
    # a prefill attention's rows are its prompt length, whatever the batch
    short, long = (_by_name(step_ops(SHAPES[0], StepShape(4, t, 0)))["attention"] for t in (64, 1024))
    assert (short.rows, long.rows) == (64, 1024)
    assert _efficiency(short, profile, False, "torch") == 0.03
    assert _efficiency(long, profile, False, "torch") == pytest.approx(0.09)


def test_expert_parallel_gathers_only_its_own_experts_rows():
    """Under TP + EP a rank gathers the rows routed to its own experts (the busiest rank's share),
    not every token's k rows as a rank holding every expert's slice must."""
    from tacit.perf_model.moe_dispatch import expert_load_factor
    from tacit.perf_model.operators import StepShape, mlp_ops

    s = shape_from_hf(load_hf_config("Qwen3-235B-A22B"))
    step = StepShape(16, 2048, 0)

    def moved(par: Parallel) -> float:
        return next(op.bytes for op in mlp_ops(s, step, par, "bf16", 32) if op.name == "dispatch_combine")

    tp, ep = Parallel(8), Parallel(8, True)
    load = expert_load_factor(s, ep, step.batch * s.sequence_draws(step.new_tokens))
    assert moved(ep) == pytest.approx(moved(tp) / 8 * load)
