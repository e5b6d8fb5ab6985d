"""`tacit predict --validate`: the model's decode step and prefill against the real engine on
this CPU, over dense (Qwen3), MoE (Qwen3-MoE) and MLA (DeepSeek-V3) random shapes, bf16 and
int8 weights, batch 1/4/16 and several context lengths.

Each engine loads once and runs its configurations with `TacitBench.latency` (the measurement
`tacit bench latency` uses): a few decode tokens, best of 2 runs (the model's configurations
run in turn, twice). The prediction is for the
same step: the decode step at the run's mean context, and the whole prompt batch as one
prefill step (the token budget is raised so the engine does not chunk it).

A MoE model's routing is measured first (perf_model/routing.py, on calibration prompts of
other lengths and seeds than the validated ones) and handed to the prediction: the random
models' tokens of one prompt route alike, so a 32-token prefill reads ~36 of 128 experts a
layer where the uniform assumption reads 112 (predicted +34% to +73% over the measured time
with it). What is validated is the time the model gives for the work the step does.

The model prices with this machine's own calibration (calibration.py), fitted first if none
matches this machine, its thread count and its current peaks: a fit made elsewhere describes
another machine state (the shipped one priced this CPU's prefill 4-6x too slow). The peaks are
checked again before each model's engine loads, and the machine refitted if they moved.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

OUTPUT_LEN = 8  # 7 decode steps a run: enough for a stable mean, short enough for ~30 configs
REPEATS = 2
ROUTING_TOKENS = (8, 64, 384)  # calibration prompt lengths: none of the validated ones
# The whole prompt batch in one step's budget (16 x 1024); prompts over the engine's default
# long_prefill_token_threshold (512) still prefill in chunks, and the prediction's scheduler
# simulation is handed the same budget, so it chunks them alike.
BATCH_TOKEN_BUDGET = 16 * 1024

# (model, weights, [(batch, input_len), ...]); "bf16" stands for the engine's compute dtype on
# this CPU (fp32 without a native bf16 matmul) and int8 runs only where the C++ kernels load:
# plan_for_host()
PLAN = [
    ("random:qwen3-100m", "bf16", [(1, 32), (1, 256), (1, 1024), (4, 32), (4, 256), (4, 1024), (16, 32), (16, 256)]),
    ("random:qwen3-100m", "int8", [(1, 32), (1, 512), (4, 32), (4, 512), (16, 32), (16, 256)]),
    ("random:qwen3-moe-2b", "bf16", [(1, 32), (1, 512), (4, 32), (4, 512), (16, 32), (16, 256)]),
    ("random:qwen3-moe-2b", "int8", [(1, 32), (4, 256)]),
    ("random:deepseek-v3-1b", "bf16", [(1, 32), (1, 512), (4, 32), (4, 512), (16, 32), (16, 256)]),
    ("random:deepseek-v3-1b", "int8", [(1, 32), (4, 256)]),
]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def plan_for_host(host) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """PLAN as this CPU runs it (fit_host.HostPrecision): bf16 is the compute dtype, and the
    weight formats the engine has no native path for here are left out."""
    plan = []
    for model, weights, configs in PLAN:
        weights = host.dtype if weights == "bf16" else weights
        if weights in host.weight_dtypes:
            plan.append((model, weights, configs))
    return plan


def engine_args(path: str, weights: str, engine_dtype: str = "bfloat16"):
    """The engine a validation measures: the whole prompt batch in one cold prefill step."""
    from tacit.config.engine_args import EngineArgs

    return EngineArgs(
        model=path,
        dtype=engine_dtype,
        quantization="int8" if weights == "int8" else "auto",
        max_model_len=2048,
        num_kv_blocks=16 * 1100 // 16 + 64,  # batch 16 at 1024 + 8 tokens, 16-token blocks
        max_num_batched_tokens=BATCH_TOKEN_BUDGET,
        # Each configuration runs its prompts REPEATS times and keeps the best: with the prefix
        # cache (on by default since issue 33) every run after the first prefilled only the last
        # block, and the measured "prefill" of qwen3-100m at 1024 tokens was 10x below the model's
        enable_prefix_caching=False,
    )


def _engine(model: str, weights: str, engine_dtype: str):
    from tacit.bench.peers.tacit_engine import TacitBench
    from tacit.bench.random_model import ensure_random_model
    from tacit.bench.workloads import random_prompts
    from tacit.engine.llm_engine import LLMEngine

    args = engine_args(str(ensure_random_model(model)), weights, engine_dtype)
    bench = TacitBench(LLMEngine(engine_args=args))
    bench.latency(random_prompts([8], 32000, seed=99), 3)  # warm-up
    return bench


def measure_once(bench, batch: int, input_len: int) -> tuple[float, float]:
    """(decode step seconds, prefill seconds) of one run. The prefill is the time to the
    batch's last first token (TacitBench.latency's ttft_s)."""
    from tacit.bench.workloads import random_prompts

    r = bench.latency(random_prompts([input_len] * batch, 32000, seed=batch), OUTPUT_LEN)
    return batch / r["decode_tok_s"], r["ttft_s"]


def measure_all(bench, configs: list[tuple[int, int]]) -> list[tuple[float, float]]:
    """Each (batch, input_len)'s best decode step and prefill over REPEATS runs, the
    configurations run in turn (all once, then all again): a slow patch of the shared machine
    costs a configuration one of its runs, not all of them (as fit_small_ops.best_seconds_each)."""
    from tacit.perf_model.fit_small_ops import best_of_each

    return best_of_each([lambda b=b, n=n: measure_once(bench, b, n) for b, n in configs], REPEATS)


def _measure_model(
    model: str, weights: str, engine_dtype: str, configs: list[tuple[int, int]]
) -> tuple[tuple[tuple[float, float], ...], list[tuple[float, float]]]:
    """Load the model's engine and measure it: (its routing draws, () for a dense model; each
    configuration's (decode step, prefill) seconds, measure_all)."""
    bench = _engine(model, weights, engine_dtype)
    draws = routing_draws(bench) if _is_moe(model) else ()
    return draws, measure_all(bench, configs)


def _is_moe(model: str) -> bool:
    from tacit.perf_model.model_shape import load_hf_config, shape_from_hf

    return shape_from_hf(load_hf_config(model)).is_moe


def routing_draws(bench) -> tuple[tuple[float, float], ...]:
    """The loaded MoE model's ModelShape.routing_draws, from one calibration prompt per length."""
    from tacit.bench.workloads import random_prompts
    from tacit.perf_model.routing import measure_routing_draws

    def prefill(t: int) -> None:
        bench.latency(random_prompts([t], 32000, seed=1000 + t), 2)

    return measure_routing_draws(bench.engine.model, prefill, ROUTING_TOKENS)


def predicted(
    model: str, weights: str, batch: int, input_len: int, draws: tuple[tuple[float, float], ...] = (), profile=None
) -> tuple[float, float]:
    from dataclasses import replace

    from tacit.config import SchedulerConfig
    from tacit.perf_model.fit_host import priced_dtypes
    from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
    from tacit.perf_model.predict import Workload, predict
    from tacit.platforms.hardware_table import get_hardware_spec

    shape = replace(shape_from_hf(load_hf_config(model)), routing_draws=draws)
    scheduler = SchedulerConfig(max_num_batched_tokens=BATCH_TOKEN_BUDGET)
    spec = get_hardware_spec("this-cpu")
    weights, kv = priced_dtypes(spec, weights, "auto", "")  # the engine's auto KV cache: its compute dtype
    p = predict(
        shape,
        spec,
        Workload(batch, input_len, OUTPUT_LEN, weights, kv, scheduler=scheduler),
        profile,
    )
    # The last request's TTFT, as measure() times it, not the batch's mean: with prompts over
    # --long-prefill-token-threshold (512) the engine prefills one at a time, and at batch 4 x
    # 1024 the mean (5 of 8 chunked steps) read -32% against the last's 8 steps
    return p.tpot_s, p.ttft.max_s if p.ttft is not None else 0.0


def _error(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    i = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[i]


def run_validation(json_out: str | None, plot: str | None = None, refit: bool = False) -> int:
    import gc

    from tacit.perf_model.calibration import calibration_profile, this_cpu_calibration
    from tacit.perf_model.fit_host import host_precision
    from tacit.platforms.compute_thread import run_on_own_thread

    host = host_precision()
    plan = plan_for_host(host)
    if len(plan) < len(PLAN):
        _log(f"this CPU computes in {host.dtype} without tacit's C++ kernels: int8 weights are not validated")
    rows, routing, fits = [], {}, []
    for model, weights, configs in plan:
        # Before each model's engine loads (the fit measures an otherwise idle process): the
        # shared machine's peaks move within a validation (its float32 matmul 0.18 -> 0.13
        # TFLOP/s within one on the AVX2 EPYC, and every row after read 20-26% under), so each
        # model is priced with the fit of the machine as it is now, refitted past DRIFT_MARGIN
        calibration = this_cpu_calibration(refit and not fits)
        profile = calibration_profile(calibration)
        if not fits or calibration["fitted_at"] != fits[-1]["fitted_at"]:
            _log(f"pricing with {profile.source}")
            fits.append(_fit_record(calibration))
        _log(f"loading {model} ({weights}) ...")
        # The engine runs on a thread that ends with its measurements: an OpenMP pool left on this
        # thread would slow the next model's peaks probe and fit, which run on threads of their own
        draws, measured = run_on_own_thread(_measure_model, model, weights, host.engine_dtype, configs)
        if draws:
            routing[f"{model} {weights}"] = draws
            _log(f"  routing: one prompt's (tokens, independent draws): {draws}")
        for (batch, input_len), (step_s, prefill_s) in zip(configs, measured):
            p_step, p_prefill = predicted(model, weights, batch, input_len, draws, profile)
            p_uniform = predicted(model, weights, batch, input_len, (), profile)[1]
            row = {
                "model": model.removeprefix("random:"),
                "weights": weights,
                "batch": batch,
                "input_len": input_len,
                "decode_pred_ms": 1e3 * p_step,
                "decode_meas_ms": 1e3 * step_s,
                "decode_err": _error(p_step, step_s),
                "prefill_pred_ms": 1e3 * p_prefill,
                "prefill_meas_ms": 1e3 * prefill_s,
                "prefill_err": _error(p_prefill, prefill_s),
                "prefill_pred_uniform_routing_ms": 1e3 * p_uniform,
                "fitted_at": calibration["fitted_at"],
            }
            rows.append(row)
            _log(
                f"  {row['model']} {weights} b{batch} i{input_len}: decode {row['decode_pred_ms']:.2f} / "
                f"{row['decode_meas_ms']:.2f} ms ({100 * row['decode_err']:+.0f}%), prefill "
                f"{row['prefill_pred_ms']:.1f} / {row['prefill_meas_ms']:.1f} ms ({100 * row['prefill_err']:+.0f}%)"
            )
        gc.collect()  # the model's engine, before the next one loads
    summary = {}
    for key in ("decode", "prefill"):
        errs = [abs(r[f"{key}_err"]) for r in rows]
        summary[f"{key}_median_abs_err"] = statistics.median(errs)
        summary[f"{key}_p90_abs_err"] = _percentile(errs, 0.9)
    print(_table(rows))
    print(f"{len(rows)} configurations (predicted / measured, error = (pred - meas) / meas)")
    for k, v in summary.items():
        print(f"  {k}: {100 * v:.1f}%")
    if json_out:
        out = {"rows": rows, "summary": summary, "routing_draws": routing, "calibrations": fits}
        Path(json_out).write_text(json.dumps(out, indent=2))
    if plot:
        plot_validation(rows, plot)
    return 0


def _fit_record(calibration: dict) -> dict:
    """What the JSON says of a fit the rows were priced with: its key, time, cost, roofs, file."""
    from tacit.perf_model.calibration import calibration_path

    fit = {k: calibration[k] for k in ("key", "fitted_at", "fit_seconds")}
    fit["path"], fit["roofs"] = str(calibration_path(calibration["key"])), calibration["profile"]["roofs"]
    return fit


def plot_validation(rows: list[dict], path: str) -> None:
    """Predicted against measured milliseconds, log-log: each case's decode step and its prefill
    (two series), the y = x line and the +-10% band around it."""
    from tacit.bench.plot import plot_predicted_vs_measured

    series = {phase: [(r[f"{phase}_meas_ms"], r[f"{phase}_pred_ms"]) for r in rows] for phase in ("decode", "prefill")}
    plot_predicted_vs_measured(series, "ms", path, f"tacit predict --validate: {len(rows)} cases on this CPU")


def _table(rows: list[dict]) -> str:
    head = ("model", "weights", "batch", "input", "decode pred", "meas ms", "err", "prefill pred", "meas ms", "err")
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in rows:
        cells = (
            r["model"], r["weights"], r["batch"], r["input_len"],
            f"{r['decode_pred_ms']:.2f}", f"{r['decode_meas_ms']:.2f}", f"{100 * r['decode_err']:+.0f}%",
            f"{r['prefill_pred_ms']:.1f}", f"{r['prefill_meas_ms']:.1f}", f"{100 * r['prefill_err']:+.0f}%",
        )  # fmt: skip
        lines.append("  ".join(f"{c!s:>12}" for c in cells))
    return "\n".join(lines)
