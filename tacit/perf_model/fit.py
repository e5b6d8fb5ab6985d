"""Fit this CPU's efficiency profile from micro-benchmarks of tacit's own kernels.

    tacit predict --calibrate      (this machine's fit, cached: calibration.py calls fit())
    python -m tacit.perf_model.fit --name NAME --out FILE   (a named part's profile for a
                                   profiles file such as efficiency.json, fitted on that part)

About a minute on 2 cores. The fit is true at the thread count it runs at (torch's: set
OMP_NUM_THREADS), and calibration.py keys it by that count: predict and validate at the same.

Each measurement is turned into "the fraction of the roofline reached": roofline time
max(FLOPs / peak, bytes / bandwidth) over measured time, with peak and bandwidth from
`this-cpu` (tacit.bench.hw, measured in the same process and stored with the profile: predict
uses these stored roofs for `this-cpu`, not its own process's). Best of several repeats each
(a curve's points interleaved, fit_small_ops.best_seconds_each):
the machine is shared, and the best run is the one least disturbed.
- GEMM at 1..512 activation rows, bf16 and int8 (Q8_0) weights, through the engine's linear
  methods, over ~200 MB of distinct matrices so each pass streams from DRAM as a decode step does;
- decode attention (the C++ paged kernel over a 2048-token cache); prefill attention through
  the engine's own torch_paged backend (fit_attention.py);
- one layer's elementwise ops and the sampler, on tacit's modules (fit_small_ops.py), each
  divided by the very byte count operators.py charges them;
- MLA's prefill path and its absorbed decode projections (csrc/head_bmm.cpp), fit_attention.py; the C++
  experts kernel, fit_experts.py;
- last, the fused C++ decode path's projections in whole engine decode steps of a synthetic
  8-layer Qwen3 (fit_decode.py), net of the other operators as the profile so far predicts them;
- the engine's fixed cost per step and per layer: decode steps of tiny 1- and 4-layer random
  Qwen3s (the fused C++ decode path), where FLOPs and bytes are ~0, fitted as a + b * layers;
  the torch path's from 256-wide synthetic DeepSeek-V3, Qwen3-MoE and Qwen3 models at two
  depths, net of their predicted operators (fit_torch_decode.py); a step with prompt tokens
  from a short prompt's TTFT on the 256-wide Qwen3 at two depths, likewise (fit_prefill.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from tacit.layers.linear_method import SKINNY_ROWS
from tacit.perf_model.efficiency import _curve, _profile
from tacit.perf_model.fit_attention import (
    absorbed_bmm_curve,
    mla_prefill_attention_efficiency,
    prefill_attention_efficiency,
    torch_decode_attention_curve,
    torch_decode_group_seconds,
)
from tacit.perf_model.fit_decode import fused_decode_curve, step_measures
from tacit.perf_model.fit_experts import experts_curve
from tacit.perf_model.fit_host import host_precision, torch_dtype
from tacit.perf_model.fit_prefill import prefill_overheads
from tacit.perf_model.fit_small_ops import best_of_each, best_seconds_each, elementwise_curve, sampling_curve
from tacit.perf_model.fit_torch_decode import DENSE_CONFIG, GQA_DEPTHS, MOE_CONFIG, torch_decode_overheads

# Both sides of the unquantized linear method's switch from W @ x.T to F.linear (SKINNY_ROWS):
# its speed is not smooth there. On the AVX2-only EPYC in float32 (scripts/gemm_rows_speed.py,
# the fit's 1024 x 2816 shape) it ran 88.7 GFLOP/s at 32 rows (W @ x.T) and 64.6 at 33
# (F.linear), 84.1 at 48, 93.8 at 64, 110.0 at 128. Interpolated from 32 to 64 the curve priced
# the GEMMs of a 33-row decode step of the bursty replay at 77 ms where the engine spent 125 in
# them (torch profiler); 128 fills the gap to 256 that serving's 65-256-row decode steps fall in.
ROWS = (1, 2, 4, 8, 16, SKINNY_ROWS, SKINNY_ROWS + 1, 48, 64, 128, 256, 512)
# A prefill step's rows reach the scheduler's token budget (2,048 by default; --validate runs
# 4 x 512-token chunks a step), where the curve was flat from 512: compute-bound, so 4 copies
# (23 MB of bf16) are enough there, and the pass costs 47 GFLOP instead of 34 copies' 400
BIG_ROWS, BIG_COPIES = (1024, 2048), 4


def _gemm_curve(
    dtype: str, peak: float, bw: float, repeats: int, k: int = 1024, n: int = 2816, copies: int = 34, rows=ROWS
) -> dict:
    """k x n projections (default 5.8 MB in bf16: a Qwen3-MoE-2b-sized one), `copies` of them
    (default ~196 MB of bf16 weights in all: far beyond the caches), through the linear method
    the engine gives `dtype` here: bf16 on the C++ GEMV where the kernels load, int8 (Q8_0) on
    theirs, fp32 (a CPU without a native bf16 matmul) on torch's. Bytes as operators' gemm_op
    charges them."""
    from tacit.kernels.cpu_kernels import load_cpu_kernels
    from tacit.kernels.weight_quant import quantize_int8_per_channel
    from tacit.layers.cpu_linear_method import CpuBf16GemvLinearMethod
    from tacit.layers.ggml_linear_method import GGMLLinearMethod
    from tacit.layers.linear_method import UnquantizedLinearMethod
    from tacit.perf_model.op_types import gemm_op

    kernels = load_cpu_kernels()
    act = torch_dtype(dtype)
    layers, method = [], None
    for _ in range(copies):
        w = torch.randn(n, k).to(act)
        if dtype != "int8":
            layers.append(SimpleNamespace(weight=w, in_features=k))
        else:
            g = quantize_int8_per_channel(w.float())
            layers.append(SimpleNamespace(weight=g.data, in_features=k))
    if dtype == "int8":
        from tacit.kernels.weight_quant import Q8_0

        method = GGMLLinearMethod(Q8_0, kernels)
    elif dtype == "bf16" and kernels is not None:
        method = CpuBf16GemvLinearMethod(kernels)
    else:
        method = UnquantizedLinearMethod()
    effs = []
    xs = [torch.randn(m, k).to(act) for m in rows]
    secs = best_seconds_each([lambda x=x: [method.apply(layer, x) for layer in layers] for x in xs], repeats)
    for m, t in zip(rows, secs):
        op = gemm_op("bench", "dense_mlp", m, k, n, dtype, 32, copies)
        # Not capped at 1: the peak is one probe shape (bench hw's 1024^3 matmul), and a GEMM
        # beating it must still be priced at its measured time (the shipped fit hit a 1.0 cap
        # at 256 and 512 rows and could not say how fast they ran)
        effs.append(round(max(op.flops / peak, op.bytes / bw) / t, 4))
        print(f"  gemm {dtype} rows {m}: {t * 1e3:.2f} ms, efficiency {effs[-1]:.3f}", file=sys.stderr)
    return {"rows": list(rows), "eff": effs}


def _attention_decode(bw: float, repeats: int) -> float:
    """The C++ paged decode kernel over a 2048-token cache: the fraction of bandwidth its KV
    stream reaches (the best of batch 1 and 8)."""
    from tacit.bench.attention import measure_attention

    hf = {
        "hidden_size": 1024,
        "num_hidden_layers": 6,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 128,
    }
    rows = measure_attention(hf, 2048, [1, 8], ["bfloat16"], repeats)
    return round(min(max(r["kv_gb_per_s"] * 1e9 for r in rows) / bw, 1.0), 4)


def _tiny_qwen3(layers: int, root: Path) -> Path:
    import transformers

    from tacit.bench.random_model import _byte_level_tokenizer

    cfg = transformers.Qwen3Config(
        hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, vocab_size=512,
        max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=511,
        num_key_value_heads=2, head_dim=16, intermediate_size=128,
    )  # fmt: skip
    path = root / f"qwen3-{layers}"
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    _byte_level_tokenizer(512).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return path


def _overheads(repeats: int) -> tuple[dict, dict]:
    """Per step and per layer of the fused path: step(layers) = a + b * layers from tiny 1- and
    4-layer Qwen3s, measured in turn (the torch path's: fit_torch_decode.py, at 256 wide)."""
    with tempfile.TemporaryDirectory() as root:
        measures = [step_measures(_tiny_qwen3(n, Path(root)), "bf16", (1,))[1] for n in (1, 4)]
        t1, t4 = best_of_each(measures, repeats)
    b = max((t4 - t1) / 3, 0.0)
    print(f"  Qwen3: 1 layer {t1 * 1e3:.3f} ms, 4 layers {t4 * 1e3:.3f} ms", file=sys.stderr)
    return {"decode_fused": round(max(t1 - b, 0.0), 7)}, {"decode_fused": round(b, 7)}


STAGES = 17  # the progress ticks below


def fit(repeats: int = 5, progress: Callable[[str, int], None] | None = None) -> dict:
    """The profile, fitted in this process at torch's thread count; `progress(stage, STAGES)`
    after each stage. Each stage times the path the engine runs on this CPU (fit_host.py): its
    compute dtype, and the C++ kernels' stages only where they load."""
    from tacit.platforms.hardware_table import measure_this_cpu_spec

    def tick(stage: str) -> None:
        if progress is not None:
            progress(stage, STAGES)

    host = host_precision()
    dt = host.dtype
    spec = measure_this_cpu_spec()  # now, not the process's first measurement: a refit's roofs are today's
    # measure_this_cpu_spec's "bf16" peak is the faster of bf16 and float32: the compute dtype's
    peak, bw = spec.peak_flops("bf16"), spec.memory_bandwidth.value
    kernels = "C++ kernels" if host.kernels else "no C++ kernels (torch paths)"
    print(f"this-cpu: {peak / 1e12:.3f} TFLOP/s {dt}, {bw / 1e9:.1f} GB/s read, {kernels}", file=sys.stderr)
    tick("roofs")
    gemm = {}
    for d in (dt, "int8"):
        if d not in host.weight_dtypes:
            tick(f"gemm {d}: skipped, no kernels")
            continue
        small = _gemm_curve(d, peak, bw, repeats)
        big = _gemm_curve(d, peak, bw, repeats, copies=BIG_COPIES, rows=BIG_ROWS)
        gemm[d] = {"rows": small["rows"] + big["rows"], "eff": small["eff"] + big["eff"]}
        tick(f"gemm {d}")
    gemm["bmm"] = absorbed_bmm_curve(peak, bw, repeats, dt)
    tick("bmm")
    gemm[f"moe_{dt}"] = experts_curve(peak, bw, repeats, dt)
    tick("experts")
    torch_decode = None
    if host.fused_decode:
        attention_decode = _attention_decode(bw, repeats)
    else:
        torch_decode = torch_decode_attention_curve(peak, bw, repeats, dt)
        torch_decode_group_s = torch_decode_group_seconds(repeats, dt)
        # MLA's absorbed decode (no GQA group) takes the widest group's figure
        attention_decode = torch_decode["eff"][-1]
    tick("decode attention")
    attention_prefill = prefill_attention_efficiency(peak, bw, repeats, dt)
    tick("prefill attention")
    attention_prefill_mla = mla_prefill_attention_efficiency(peak, bw, repeats, _curve(gemm[dt]), dt)
    tick("MLA prefill attention")
    elementwise = elementwise_curve(bw, repeats, host.torch_dtype)
    tick("elementwise")
    sampling = sampling_curve(bw, repeats, host.torch_dtype)
    tick("sampling")
    step, layer = _overheads(repeats) if host.fused_decode else ({}, {})
    tick("step overheads")
    profile = {
        "source": "fitted on this machine by tacit.perf_model.fit",
        # On a shared 2-core machine, OMP_NUM_THREADS=1 is steadier: with 2 threads every OpenMP
        # region waited a scheduler slice for a descheduled thread (an 8-row Q8_0 GEMV took
        # 7.7 ms instead of 0.1); the thread count is recorded, and calibration.py keys by it
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "fitted_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "roofs": {"bf16_flops": peak, "read_bandwidth": bw, "threads": torch.get_num_threads()},
        "compute_dtype": dt,
        "gemm": gemm,
        "attention_decode": attention_decode,
        **(
            {"attention_decode_torch": torch_decode, "attention_decode_torch_group_s": torch_decode_group_s}
            if torch_decode
            else {}
        ),
        "attention_prefill": attention_prefill,
        "attention_prefill_mla": attention_prefill_mla,
        "elementwise": elementwise,
        "sampling": sampling,
        # the fixed costs are fitted per step and per layer below, not per kernel launch
        "op_overhead_s": 0.0,
        "step_overhead_s": step,
        "layer_overhead_s": layer,
        "row_overhead_s": {},  # the torch path's, fitted below
        "row_layer_overhead_s": {},
        # tacit's fused C++ decode step covers Llama/Qwen dense, Qwen3-MoE and DeepSeek-V3 (MLA
        # layers): no architecture's bf16 decode runs the torch path where the kernels load;
        # without them every architecture's does ("*")
        "torch_decode_architectures": [] if host.fused_decode else ["*"],
        "reduce_bytes": 4,  # tacit's CPU ranks all-reduce in float32
    }
    # Last: these subtract the step's other operators as the profile so far predicts them
    rows, row_layers = profile["row_overhead_s"], profile["row_layer_overhead_s"]
    fitted = torch_decode_overheads(spec, _profile("this-cpu", profile), repeats, dt)
    step["torch"], layer["torch"], rows["torch"], row_layers["torch"] = fitted
    tick("torch-path overheads")
    # A dense layer is a few torch ops where DeepSeek's MLA and MoE layer is dozens: priced with
    # DeepSeek's 1.9 ms a layer, random:qwen3-100m's float32 decode read +20-50% on an AVX2-only
    # EPYC (`tacit predict --validate`); a Qwen3-MoE layer sits between (0.9 ms to DeepSeek's 1.2-1.4)
    for kind, config in (("dense", DENSE_CONFIG), ("moe", MOE_CONFIG)):
        if host.fused_decode:
            tick(f"{kind} torch-path overheads: skipped, the fused step decodes these models")
            continue
        partial = _profile("this-cpu", profile)
        fitted = torch_decode_overheads(spec, partial, repeats, dt, config, GQA_DEPTHS)
        path = f"torch_{kind}"
        step[path], layer[path], rows[path], row_layers[path] = fitted
        tick(f"{kind} torch-path overheads")
    step["prefill"], layer["prefill"] = prefill_overheads(spec, _profile("this-cpu", profile), repeats, dt)
    tick("prefill overheads")
    for dtype in ("bf16", "int8"):
        if not host.fused_decode:
            tick(f"fused decode {dtype}: skipped, no kernels")
            continue
        partial = _profile("this-cpu", profile)
        gemm[f"{dtype}_fused_decode"] = fused_decode_curve(dtype, spec, partial, repeats)
        tick(f"fused decode {dtype}")
    return profile


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="the profile's name: the part it is fitted on")
    p.add_argument("--out", required=True, help="the profiles JSON file to add it to (e.g. efficiency.json)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.name == "this-cpu":
        p.error("--name this-cpu: this machine's fit lives in the cache: tacit predict --calibrate")
    out = Path(args.out)
    profiles = json.loads(out.read_text()) if out.exists() else {}
    profiles[args.name] = fit(args.repeats)
    out.write_text(json.dumps(profiles, indent=1) + "\n")
    print(f"wrote {args.name} to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
