"""this-cpu's calibration: the machine key, the cache's hit / miss / drift / corrupt-file logic
and the fit's plumbing, with the micro-benchmarks replaced by known timings (the real fit takes
about a minute and never runs in tests: conftest.calibration_dir refuses it)."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from tacit.perf_model import calibration
from tacit.perf_model.efficiency import DATA

PEAKS = {"bf16_flops": 1.0e12, "read_bandwidth": 30e9}
REFERENCE = json.loads(DATA.read_text())["vm-2vcpu-no-amx-1thread"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty calibration directory, this process's peaks pinned to PEAKS, and a fake fit that
    counts its calls and stores the peaks it "measured", as fit.fit does."""
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path)
    peaks = dict(PEAKS)
    monkeypatch.setattr(calibration, "current_peaks", lambda spec=None: dict(peaks))
    fits = []

    def fake_fit(repeats):
        fits.append(repeats)
        return {**REFERENCE, "roofs": {**peaks, "threads": 2}}

    monkeypatch.setattr(calibration, "run_fit", fake_fit)
    return SimpleNamespace(dir=tmp_path, peaks=peaks, fits=fits)


def test_the_key_names_processor_cpus_and_threads():
    key = calibration.machine_key(threads=1)
    assert key["threads"] == 1 and key["logical_cpus"] >= 1 and key["processor"]
    assert set(key) == {"processor", "cpu_ids", "logical_cpus", "threads", "torch", "fit_version"}
    one, two = calibration.calibration_path(key), calibration.calibration_path(calibration.machine_key(threads=2))
    assert one != two and one.parent == two.parent == calibration.calibration_dir()
    assert one.name.endswith(".json") and f"-{key['logical_cpus']}cpu-1t-" in one.name


def test_first_use_fits_then_the_cache_hits(cache, capsys):
    p = calibration.this_cpu_profile()
    assert cache.fits == [calibration.REPEATS] and p.roofs["read_bandwidth"] == PEAKS["read_bandwidth"]
    assert "no calibration for this machine" in capsys.readouterr().err
    data = json.loads(calibration.calibration_path(calibration.machine_key()).read_text())
    assert data["key"] == calibration.machine_key() and data["command"] == "tacit predict --calibrate"
    assert data["fitted_at"] and data["profile"]["roofs"]["bf16_flops"] == PEAKS["bf16_flops"]
    assert calibration.this_cpu_profile().gemm == p.gemm and cache.fits == [calibration.REPEATS]  # a hit: no second fit
    calibration.this_cpu_profile(refit=True)  # --calibrate
    assert cache.fits == [calibration.REPEATS] * 2


def test_the_fit_runs_off_the_callers_thread(cache, monkeypatch):
    """Its torch work would leave the caller's thread an OpenMP pool that slows the engine
    threads started after it (tacit tune's trials: platforms/compute_thread.py)."""
    ran_on = []
    monkeypatch.setattr(
        calibration,
        "run_fit",
        lambda repeats: ran_on.append(threading.get_ident()) or {**REFERENCE, "roofs": {**cache.peaks, "threads": 2}},
    )
    calibration.this_cpu_profile(refit=True)
    assert len(ran_on) == 1 and ran_on[0] != threading.get_ident()


def test_peaks_moving_past_the_margin_refit(cache, capsys):
    calibration.this_cpu_profile()
    cache.peaks["read_bandwidth"] = PEAKS["read_bandwidth"] * 0.85  # within 20%: the same machine state
    calibration.this_cpu_profile()
    assert len(cache.fits) == 1
    cache.peaks["bf16_flops"] = PEAKS["bf16_flops"] * 6.6  # the AMX change the shipped fit missed
    capsys.readouterr()
    calibration.this_cpu_profile()
    assert len(cache.fits) == 2
    assert "bf16_flops 1000.0 -> 6600.0 GFLOP/s (+560%, margin 20%)" in capsys.readouterr().err


def test_another_thread_count_is_another_calibration(cache):
    calibration.this_cpu_profile()
    data, why = calibration.lookup(threads=calibration.machine_key()["threads"] + 1)
    assert data is None and "no calibration for this machine" in why


def test_drift_margin():
    assert calibration.DRIFT_MARGIN == 0.20
    assert calibration.drift(PEAKS, {**PEAKS, "read_bandwidth": 30e9 * 1.19}) == []
    (moved,) = calibration.drift(PEAKS, {**PEAKS, "read_bandwidth": 30e9 * 0.79})
    assert moved.startswith("read_bandwidth 30.0 -> 23.7 GB/s (-21%")


def test_a_corrupt_file_is_named_and_refitted(cache, capsys):
    path = calibration.calibration_path(calibration.machine_key())
    path.write_text("{oops")
    with pytest.raises(calibration.CalibrationError, match=r"is not a tacit calibration \(JSONDecodeError"):
        calibration.read_calibration(path)
    calibration.this_cpu_profile()
    assert len(cache.fits) == 1 and f"{path} is not a tacit calibration" in capsys.readouterr().err
    path.write_text(json.dumps({"key": calibration.machine_key(), "profile": {"gemm": {}}}))
    assert "is not a tacit calibration (KeyError" in calibration.lookup()[1]


def test_a_file_of_another_machine_is_a_miss(cache):
    calibration.this_cpu_profile()
    path = calibration.calibration_path(calibration.machine_key())
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "key": {**data["key"], "processor": "another"}}))
    assert "was fitted for another machine" in calibration.lookup()[1]


def test_named_hardware_keeps_its_shipped_profile():
    from tacit.perf_model.efficiency import load_profile
    from tacit.platforms.hardware_table import get_hardware_spec

    assert calibration.profile_for(get_hardware_spec("h100-sxm")).name == "nvidia-hopper"
    with pytest.raises(ValueError, match="this machine's own fit, not a shipped entry"):
        load_profile("this-cpu")


def test_gemm_efficiency_is_roofline_time_over_measured_and_not_capped(monkeypatch):
    from tacit.perf_model import fit

    monkeypatch.setattr(fit, "best_seconds_each", lambda fns, repeats: [2e-3] * len(fns))  # known, nothing run
    k, n, copies, peak, bw = 64, 128, 2, 1e9, 1e10
    curve = fit._gemm_curve("bf16", peak, bw, 1, k=k, n=n, copies=copies, rows=(1, 300))
    want = [max(2 * m * k * n * copies / peak, (k * n * 2 + m * (k + n) * 2) * copies / bw) / 2e-3 for m in (1, 300)]
    assert curve["rows"] == [1, 300] and curve["eff"] == [round(w, 4) for w in want]
    assert curve["eff"][1] > 1  # faster than the probe's peak: priced at its measured time


def _stub_fit_stages(monkeypatch, host):
    """fit.fit with every measurement replaced by a known figure, on a host of `host`'s kind."""
    from tacit.perf_model import fit
    from tacit.platforms import hardware_table
    from tacit.platforms.specs import Sourced

    monkeypatch.setattr(fit, "host_precision", lambda: host)
    spec = SimpleNamespace(peak_flops=lambda dtype: 2e11, memory_bandwidth=Sourced(3e10, "test"))
    monkeypatch.setattr(hardware_table, "measure_this_cpu_spec", lambda: spec)
    curve = {"rows": [1, 64], "eff": [0.5, 0.8]}
    for name in ("absorbed_bmm_curve", "experts_curve", "fused_decode_curve"):
        monkeypatch.setattr(fit, name, lambda *a, **k: curve)
    monkeypatch.setattr(
        fit, "_gemm_curve", lambda *a, rows=fit.ROWS, **k: {"rows": list(rows), "eff": [0.5] * len(rows)}
    )
    for name in ("prefill_attention_efficiency", "mla_prefill_attention_efficiency", "sampling_curve"):
        monkeypatch.setattr(fit, name, lambda *a, **k: {"rows": [32, 512], "eff": [0.1, 0.2]})
    monkeypatch.setattr(fit, "elementwise_curve", lambda *a, **k: {"bytes": [1e6, 1e8], "eff": [0.3, 0.1]})
    monkeypatch.setattr(fit, "_attention_decode", lambda *a, **k: 0.5)
    monkeypatch.setattr(fit, "torch_decode_attention_curve", lambda *a, **k: {"rows": [1, 8], "eff": [0.5, 0.25]})
    monkeypatch.setattr(fit, "_overheads", lambda r: ({"decode_fused": 1e-4}, {"decode_fused": 6e-6}))
    # (per step, per layer, per row, per row and layer) by the synthetic model's architecture:
    # DeepSeek-V3's by default
    by_arch = {
        "DeepseekV3Config": (2e-4, 3e-5, 1e-4, 3e-5),
        "Qwen3Config": (1e-4, 1e-5, 6e-5, 1e-5),
        "Qwen3MoeConfig": (1.5e-4, 2e-5, 1e-4, 4e-5),
    }
    monkeypatch.setattr(
        fit, "torch_decode_overheads", lambda *a: by_arch[a[4]["arch"] if len(a) > 4 else "DeepseekV3Config"]
    )
    monkeypatch.setattr(fit, "prefill_overheads", lambda *a: (5e-3, 1e-3))


def test_fit_assembles_a_profile_stage_by_stage(monkeypatch):
    from tacit.perf_model import fit
    from tacit.perf_model.efficiency import _profile
    from tacit.perf_model.fit_host import HostPrecision

    _stub_fit_stages(monkeypatch, HostPrecision("bf16", kernels=True))
    ticks = []
    d = fit.fit(1, progress=lambda stage, total: ticks.append((stage, total)))
    assert len(ticks) == fit.STAGES and {t for _, t in ticks} == {fit.STAGES}
    assert d["roofs"]["bf16_flops"] == 2e11 and d["roofs"]["read_bandwidth"] == 3e10 and d["roofs"]["threads"] >= 1
    p = _profile("this-cpu", d)
    assert p.step_overhead_s == {"decode_fused": 1e-4, "torch": 2e-4, "prefill": 5e-3}
    assert p.layer_overhead_s["prefill"] == 1e-3 and p.gemm_efficiency("int8", 1) == 0.5
    assert set(p.gemm) == {"bf16", "int8", "bmm", "moe_bf16", "bf16_fused_decode", "int8_fused_decode"}
    assert p.gemm["bf16"].rows == (*fit.ROWS, *fit.BIG_ROWS)  # up to a prefill step's 2,048 rows
    assert p.compute_dtype == "bf16" and p.decode_path("Qwen3ForCausalLM", "dense") == "decode_fused"
    assert p.attention_decode == 0.5


def test_fit_without_native_bf16_times_the_float32_torch_paths(monkeypatch):
    """An AVX2-only CPU: the engine computes in float32 with no C++ kernels, so the fit times
    float32, skips the kernels' stages (no int8, experts or fused-decode curve) and prices every
    architecture's decode on the torch path."""
    from tacit.perf_model import fit
    from tacit.perf_model.efficiency import _profile
    from tacit.perf_model.fit_host import HostPrecision

    _stub_fit_stages(monkeypatch, HostPrecision("fp32", kernels=False))
    dtypes = []
    monkeypatch.setattr(
        fit,
        "_gemm_curve",
        lambda d, *a, rows=fit.ROWS, **k: dtypes.append(d) or {"rows": list(rows), "eff": [0.5] * len(rows)},
    )
    ticks = []
    d = fit.fit(1, progress=lambda stage, total: ticks.append((stage, total)))
    assert len(ticks) == fit.STAGES and dtypes == ["fp32", "fp32"]  # up to 512 rows, then the prefill rows
    p = _profile("this-cpu", d)
    assert set(p.gemm) == {"fp32", "bmm", "moe_fp32"} and p.compute_dtype == "fp32"
    assert p.attention_decode == 0.25
    assert p.step_overhead_s == {"torch": 2e-4, "torch_dense": 1e-4, "torch_moe": 1.5e-4, "prefill": 5e-3}
    assert p.layer_overhead_s["torch_dense"] == 1e-5 and p.layer_overhead_s["torch_moe"] == 2e-5
    assert p.row_overhead_s == {"torch": 1e-4, "torch_dense": 6e-5, "torch_moe": 1e-4}
    assert p.row_layer_overhead_s == {"torch": 3e-5, "torch_dense": 1e-5, "torch_moe": 4e-5}
    # each layer kind's decode its own fixed costs, on every architecture
    assert all(p.decode_path(a, "mla") == "torch" for a in ("Qwen3ForCausalLM", "DeepseekV3ForCausalLM"))
    assert p.decode_path("Qwen3ForCausalLM", "dense") == "torch_dense"
    assert p.decode_path("Qwen3MoeForCausalLM", "moe") == "torch_moe"
    assert p.attention_decode_torch(1) == 0.5 and p.attention_decode_torch(8) == 0.25
    # a dtype without its own curve borrows the compute dtype's
    assert p.gemm_efficiency("bf16", 1) == p.gemm_efficiency("int8", 1) == 0.5


def test_host_precision_follows_the_platform(monkeypatch):
    from tacit.kernels import cpu_kernels
    from tacit.perf_model.fit_host import host_precision
    from tacit.platforms import cpu

    monkeypatch.setattr(cpu, "bf16_matmul_is_native", lambda: False)
    host = host_precision()
    assert (host.dtype, host.kernels, host.engine_dtype, host.weight_dtypes) == ("fp32", False, "float32", ("fp32",))
    monkeypatch.setattr(cpu, "bf16_matmul_is_native", lambda: True)
    monkeypatch.setattr(cpu_kernels, "load_cpu_kernels", lambda *a: object())
    host = host_precision()
    assert (host.dtype, host.fused_decode, host.weight_dtypes) == ("bf16", True, ("bf16", "int8"))


def test_calibrate_flag_is_for_this_machine(capsys):
    from tacit.cli import main

    assert main(["predict", "--model", "random:qwen3-100m", "--hardware", "h100-sxm", "--calibrate"]) == 2
    assert (
        "--calibrate fits this machine (--hardware this-cpu or --validate), not 'h100-sxm'" in capsys.readouterr().err
    )


def test_validation_measures_a_cold_prefill():
    """Each configuration's prompts run twice: a prefix cache would make the second a hit."""
    from tacit.perf_model.validate import engine_args

    args = engine_args("some/model", "int8")
    assert args.enable_prefix_caching is False and args.quantization == "int8"
    assert args.max_num_batched_tokens >= 16 * 1024  # batch 16 at 1024 tokens in one step


def test_a_curves_points_are_timed_interleaved():
    """Each repeat visits every point, so a slow patch costs each point one repeat, not all."""
    from tacit.perf_model.fit_small_ops import best_seconds_each

    calls = []
    best = best_seconds_each([lambda: calls.append("a"), lambda: calls.append("b")], 3)
    assert calls == ["a", "b"] + ["a", "b"] * 3 and len(best) == 2 and all(t >= 0 for t in best)


def test_a_prefill_steps_fixed_cost_is_its_own_and_falls_back_to_the_torch_paths():
    from dataclasses import replace

    from tacit.perf_model.efficiency import _profile
    from tacit.perf_model.roofline import step_seconds

    overheads = {"step_overhead_s": {"torch": 2e-3}, "layer_overhead_s": {"torch": 1e-4}}
    torch_only = _profile("t", {**REFERENCE, **overheads})
    assert step_seconds([], torch_only, "prefill", 10) == pytest.approx(2e-3 + 10 * 1e-4)
    fitted = replace(torch_only, step_overhead_s={"torch": 2e-3, "prefill": 5e-3}, layer_overhead_s={"prefill": 1e-3})
    assert step_seconds([], fitted, "prefill", 10) == pytest.approx(5e-3 + 10 * 1e-3)
    assert step_seconds([], fitted, "torch", 10) == pytest.approx(2e-3)  # decode on the torch path


def test_torch_path_decode_fixed_costs_follow_the_layer_kind():
    """Without the fused step every architecture decodes on the torch path, whose fixed cost a
    layer differs by kind (0.6-0.7 ms dense, ~0.9 GQA + MoE, 1.2-1.4 DeepSeek's on an AVX2 EPYC):
    each shape is charged its own kind's figure, a kind the profile did not fit DeepSeek's."""
    from dataclasses import replace

    from tacit.perf_model.efficiency import _profile
    from tacit.perf_model.model_shape import ModelShape
    from tacit.perf_model.predict import Workload, predict
    from tacit.platforms.hardware_table import get_hardware_spec

    spec = get_hardware_spec("this-cpu")
    layer = {"torch": 3e-3, "torch_dense": 1e-3, "torch_moe": 2e-3}
    fitted = replace(
        _profile("t", REFERENCE),
        torch_decode_architectures=("*",),
        step_overhead_s=dict.fromkeys(layer, 0.0),
        layer_overhead_s=layer,
    )
    unfitted = replace(fitted, step_overhead_s={"torch": 0.0}, layer_overhead_s={"torch": 3e-3})
    dense = ModelShape("Qwen3ForCausalLM", 256, 4, 4, 1, 64, 704, 8000, True)
    moe = replace(dense, architecture="Qwen3MoeForCausalLM", num_experts=16, top_k=4, moe_intermediate_size=128)
    mla = replace(
        dense,
        architecture="DeepseekV3ForCausalLM",
        num_kv_heads=4,
        kv_lora_rank=128,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
    )
    w = Workload(1, 32, 2, "fp32", "fp32")
    for shape, per_layer in ((dense, 1e-3), (moe, 2e-3), (mla, 3e-3)):
        gap = predict(shape, spec, w, unfitted).tpot_s - predict(shape, spec, w, fitted).tpot_s
        assert gap == pytest.approx(4 * (3e-3 - per_layer), abs=1e-9), shape.layer_kind


def test_a_steps_per_row_host_cost_counts_its_sequences():
    """16 decode rows pay 15 rows' host cost; a speculative verify step of 4 sequences x 4 rows
    pays 3 (the cost is the scheduler's and sampler's per sequence, not per verified token)."""
    from dataclasses import replace

    from tacit.perf_model.efficiency import _profile
    from tacit.perf_model.model_shape import ModelShape
    from tacit.perf_model.operators import StepShape
    from tacit.perf_model.predict import Workload, step_time
    from tacit.platforms.hardware_table import get_hardware_spec

    spec = get_hardware_spec("this-cpu")
    base = replace(_profile("t", REFERENCE), torch_decode_architectures=("*",))
    rowed = replace(base, row_overhead_s={"torch_dense": 1e-3}, row_layer_overhead_s={"torch_dense": 1e-4})
    base = replace(
        base,
        step_overhead_s={**base.step_overhead_s, "torch_dense": 0.0},
        layer_overhead_s={**base.layer_overhead_s, "torch_dense": 0.0},
    )
    rowed = replace(rowed, step_overhead_s=base.step_overhead_s, layer_overhead_s=base.layer_overhead_s)
    dense = ModelShape("Qwen3ForCausalLM", 256, 4, 4, 1, 64, 704, 8000, True)
    w = Workload(16, 32, 2, "fp32", "fp32")
    step = StepShape(16, 1, 64)
    per_row = 1e-3 + 4 * 1e-4
    assert step_time(dense, spec, rowed, w, step)[0] - step_time(dense, spec, base, w, step)[0] == pytest.approx(
        15 * per_row
    )
    verify = step_time(dense, spec, rowed, w, step, 4)[0] - step_time(dense, spec, base, w, step, 4)[0]
    assert verify == pytest.approx(3 * per_row)


def test_torch_decode_overheads_split_the_steps_left_over_by_layer_and_row(monkeypatch):
    """Steps measured at two depths and 1 and 16 rows, less their operators (zero here), give
    a + b * layers + (rows - 1) * (c + d * layers) back; step_seconds charges it the same way."""
    from dataclasses import replace

    from tacit.bench import random_model
    from tacit.perf_model import fit_torch_decode as ftd
    from tacit.perf_model.efficiency import _profile
    from tacit.perf_model.roofline import OpTime, step_seconds

    a, b, c, d = 1e-3, 6e-4, 1e-4, 3e-5

    def step(layers, rows):
        return a + b * layers + (rows - 1) * (c + d * layers)

    monkeypatch.setattr(random_model, "write_random_model", lambda cfg, path: cfg["num_hidden_layers"])
    monkeypatch.setattr(ftd, "step_measures", lambda layers, *x: {r: lambda r=r: step(layers, r) for r in ftd.ROWS})
    monkeypatch.setattr(ftd, "op_time", lambda op, *x: OpTime(op, 0.0, 0.0, 0.0, 1.0))
    fitted = ftd.torch_decode_overheads(None, None, 2, "fp32", ftd.DENSE_CONFIG, ftd.GQA_DEPTHS)
    assert fitted == pytest.approx((a, b, c, d))
    profile = _profile("t", {**REFERENCE, "step_overhead_s": {"torch": a}, "layer_overhead_s": {"torch": b}})
    priced = replace(profile, row_overhead_s={"torch": c}, row_layer_overhead_s={"torch": d})
    assert step_seconds([], priced, "torch", 12, rows=16) == pytest.approx(step(12, 16))
    assert step_seconds([], profile, "torch", 12, rows=16) == pytest.approx(step(12, 1))  # no row fit: none


def test_validation_predicts_the_last_first_token_as_it_measures(cache):
    """measure() times the batch's last first token: the prediction compared is the max TTFT."""
    from tacit.config import SchedulerConfig
    from tacit.perf_model import validate
    from tacit.perf_model.efficiency import _profile
    from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
    from tacit.perf_model.predict import Workload, predict
    from tacit.platforms.hardware_table import get_hardware_spec

    profile = _profile("this-cpu", REFERENCE)
    _, ttft = validate.predicted("random:qwen3-100m", "bf16", 4, 1024, profile=profile)
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    sched = SchedulerConfig(max_num_batched_tokens=validate.BATCH_TOKEN_BUDGET)
    w = Workload(4, 1024, validate.OUTPUT_LEN, "bf16", scheduler=sched)
    p = predict(shape, get_hardware_spec("this-cpu"), w, profile)
    # prompts over the long-prefill threshold (512) go one at a time: the last is well past the mean
    assert ttft == pytest.approx(p.ttft.max_s) and p.ttft.max_s > 1.2 * p.ttft.mean_s


def test_validation_plan_follows_the_host():
    """bf16 rows run in the engine's compute dtype; int8 (the C++ GGML kernels) only where they load."""
    from tacit.perf_model.fit_host import HostPrecision
    from tacit.perf_model.validate import PLAN, plan_for_host

    assert plan_for_host(HostPrecision("bf16", kernels=True)) == PLAN
    fp32 = plan_for_host(HostPrecision("fp32", kernels=False))
    assert {w for _, w, _ in fp32} == {"fp32"}
    assert [(m, c) for m, _, c in fp32] == [(m, c) for m, w, c in PLAN if w == "bf16"]
    assert {w for _, w, _ in plan_for_host(HostPrecision("bf16", kernels=False))} == {"bf16"}


def test_torch_path_decode_attention_is_priced_by_gqa_group():
    """torch's SDPA expands K/V to every query head: a GQA decode attention on the torch path
    takes the fitted curve at its group; the fused path, a prefill and MLA keep their figures."""
    from dataclasses import replace

    from tacit.perf_model.efficiency import Curve, load_profile
    from tacit.perf_model.model_shape import ModelShape
    from tacit.perf_model.operators import Parallel, StepShape, attention_ops
    from tacit.perf_model.roofline import _efficiency

    profile = replace(
        load_profile("nvidia-hopper"), attention_decode=0.3, attention_decode_torch=Curve((1.0, 8.0), (0.6, 0.1))
    )
    gqa = ModelShape("Qwen3ForCausalLM", 768, 2, 12, 4, 64, 2048, 100, True)  # 3 query heads a KV head
    op = attention_ops(gqa, StepShape(4, 1, 1024), Parallel(), "fp32", "fp32", 32)[-1]
    assert op.gqa_group == 3
    assert _efficiency(op, profile, True, "torch_dense") == pytest.approx(Curve((1.0, 8.0), (0.6, 0.1))(3))
    assert _efficiency(op, profile, True, "decode_fused") == 0.3
    mla = ModelShape(
        "DeepseekV3ForCausalLM", 1024, 2, 16, 16, 0, 2048, 100, True, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    )  # fmt: skip
    mla_op = next(
        o
        for o in attention_ops(mla, StepShape(4, 1, 1024), Parallel(), "fp32", "fp32", 32)
        if o.op_class == "attention"
    )
    assert mla_op.gqa_group == 0 and _efficiency(mla_op, profile, True, "torch") == 0.3


def test_self_timed_measures_run_round_robin_and_keep_their_best():
    """A slow patch costs each depth of a fixed-cost fit one repeat, not all of them."""
    from tacit.perf_model.fit_small_ops import best_of_each

    calls, readings = [], {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 9.0, 4.0])}

    def measure(name: str):
        return lambda: calls.append(name) or next(readings[name])

    assert best_of_each([measure("a"), measure("b")], 3) == [1.0, 2.0]
    assert calls == ["a", "b"] * 3


class _FakeBench:
    """TacitBench.latency's shape: each call's decode step (10 ms) and TTFT (100 ms) times the
    next slowdown of a script; records each call's batch."""

    def __init__(self, slow: list[float]):
        self.batches, self.slow = [], iter(slow)

    def latency(self, prompts, output_len):
        self.batches.append(len(prompts))
        k = next(self.slow)
        return {"decode_tok_s": len(prompts) / (0.01 * k), "ttft_s": 0.1 * k}


def test_validation_runs_a_models_configurations_in_turn_and_keeps_each_ones_best(monkeypatch):
    """All configurations once, then all again: a slow patch (3x here) costs the runs it falls
    on, and each configuration keeps its faster run."""
    from tacit.perf_model import validate

    monkeypatch.setattr(validate, "REPEATS", 2)
    bench = _FakeBench([3, 3, 1, 1] + [1, 1, 3, 3])  # the first pass's first half slow, then the second's
    configs = [(1, 32), (4, 32), (2, 256), (16, 32)]
    best = validate.measure_all(bench, configs)
    assert bench.batches == [1, 4, 2, 16] * 2
    assert best == [pytest.approx((0.01, 0.1))] * 4


def test_validation_checks_the_machine_before_each_model(monkeypatch, tmp_path):
    """Each model's rows are priced with the fit of the machine as it is when its engine loads:
    a refit between two models (the peaks moved) prices the second with the new fit, and the
    JSON lists both."""
    from tacit.perf_model import calibration, validate
    from tacit.perf_model.fit_host import HostPrecision

    fits = iter(["2026-12-06T10:00:00", "2026-12-06T10:00:00", "2026-12-06T10:05:00"])
    profiles = []

    def fitted(refit=False):
        profile = {**REFERENCE, "roofs": {"bf16_flops": 1.5e11, "read_bandwidth": 3e10}}
        return {"key": calibration.machine_key(), "fitted_at": next(fits), "fit_seconds": 60.0, "profile": profile}

    plan = [("random:a", "fp32", [(1, 32)]), ("random:b", "fp32", [(1, 32)]), ("random:c", "fp32", [(4, 32)])]
    monkeypatch.setattr(calibration, "this_cpu_calibration", fitted)
    monkeypatch.setattr("tacit.perf_model.fit_host.host_precision", lambda: HostPrecision("fp32", kernels=False))
    monkeypatch.setattr(validate, "plan_for_host", lambda host: plan)
    loaded_on = []  # each engine's thread: not this one (an OpenMP pool left here slows the next)
    monkeypatch.setattr(validate, "_engine", lambda *a: loaded_on.append(threading.get_ident()) or _FakeBench([1] * 10))
    monkeypatch.setattr(validate, "_is_moe", lambda model: False)
    monkeypatch.setattr(validate, "predicted", lambda *a: profiles.append(a[-1].source) or (0.01, 0.1))
    out = tmp_path / "v.json"
    assert validate.run_validation(str(out)) == 0
    data = json.loads(out.read_text())
    assert [r["fitted_at"] for r in data["rows"]] == ["2026-12-06T10:00:00"] * 2 + ["2026-12-06T10:05:00"]
    assert [c["fitted_at"] for c in data["calibrations"]] == ["2026-12-06T10:00:00", "2026-12-06T10:05:00"]
    assert "10:05:00" in profiles[-1] and "10:00:00" in profiles[0]
    assert len(loaded_on) == 3 and threading.get_ident() not in loaded_on


def test_the_measured_spec_prices_with_its_own_probe_not_a_second(cache, monkeypatch):
    """profile_for(this-cpu) checks the fit against the spec's peaks: `tacit predict` probes once."""
    from tacit.platforms.specs import Sourced

    asked = []
    monkeypatch.setattr(calibration, "current_peaks", lambda spec=None: asked.append(spec) or dict(cache.peaks))
    spec = SimpleNamespace(
        name="this-cpu", efficiency_profile="this-cpu", peak_flops=lambda d: 1e12, memory_bandwidth=Sourced(3e10, "t")
    )
    calibration.profile_for(spec)
    assert asked == [spec]
