"""`tacit profile`: run real engine steps and write DIR/profile.json and DIR/report.html."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tacit.config.engine_args import EngineArgs
from tacit.profiler.collect import WorkloadRequest

_DEFAULT_BATCH, _DEFAULT_INPUT, _DEFAULT_OUTPUT = 1, 128, 32
_DEFAULT_OUT = "profile-out"
# a text-to-image model profiled: small enough for this CPU, the blocks are the same at any size
_DIFFUSION = {"size": "256x256", "steps": 2, "guidance_scale": 5.0}


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="time engine steps by kind, layer and operator class; HTML report")
    EngineArgs.add_cli_args(p)
    p.add_argument("--batch-size", type=int, default=None, help=f"requests at once (default {_DEFAULT_BATCH})")
    p.add_argument("--input-len", type=int, default=None, help=f"prompt tokens each (default {_DEFAULT_INPUT})")
    p.add_argument("--output-len", type=int, default=None, help=f"tokens generated each (default {_DEFAULT_OUTPUT})")
    p.add_argument(
        "--workload",
        default=None,
        metavar="FILE",
        help='JSON list of {"input_len": I, "output_len": O, "arrival_step": S (optional, default 0)}; '
        "instead of --batch-size/--input-len/--output-len",
    )
    p.add_argument(
        "--out",
        default=None,
        help=f"directory for profile.json and report.html (default {_DEFAULT_OUT}); "
        "under --compare: for report.html and compare.json (default: print only)",
    )
    p.add_argument(
        "--compare",
        nargs=2,
        default=None,
        metavar=("A", "B"),
        help="run nothing: compare two earlier profiles (profile.json or its directory), "
        "A before and B after, per step kind and operator class",
    )
    # 3 passes: the default workload has one prefill step a pass, and one sample has no spread.
    p.add_argument("--repeats", type=int, default=3, help="profiled passes over the workload (after one warm-up)")
    p.add_argument(
        "--no-measure-hw",
        action="store_true",
        help="skip measuring the roofs (~10 s): read them from --hw-json, or leave them out",
    )
    p.add_argument("--hw-json", default=None, metavar="FILE", help="roofs from `tacit bench hw --json FILE`")
    p.add_argument(
        "--predicted",
        default=None,
        metavar="FILE",
        help="JSON {category: seconds per decode step} or {kind: {category: seconds}} (tacit predict) to compare",
    )
    p.add_argument(
        "--predict-hardware",
        default="this-cpu",
        metavar="NAME",
        help="price the same run with `tacit predict` on this hardware for the predicted column "
        "(default this-cpu, with its cached calibration: uncalibrated, the report says so; none: leave it out; "
        "--predicted FILE takes precedence)",
    )
    g = p.add_argument_group("a text-to-image model (--model DIFFUSERS_DIR): UNet steps and a VAE decode per block")
    g.add_argument(
        "--size", default=None, help=f"WIDTHxHEIGHT profiled, multiples of 64 (default {_DIFFUSION['size']})"
    )
    g.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"UNet calls a pass, then one VAE decode (default {_DIFFUSION['steps']})",
    )
    g.add_argument(
        "--guidance-scale", type=float, default=None, help="default 5; <= 1: no guidance (UNet batch 1, not 2)"
    )
    p.set_defaults(func=cmd_profile)


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def load_workload(path: str) -> list[WorkloadRequest]:
    """A workload file: a JSON list of requests; each names its input_len and output_len."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--workload {path}: no such file")
    try:
        items = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--workload {path}: not JSON ({e})") from None
    if not isinstance(items, list) or not items:
        raise ValueError(f'--workload {path}: expected a non-empty JSON list of {{"input_len", "output_len"}} objects')
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"input_len", "output_len", "arrival_step"}:
            raise ValueError(
                f"--workload {path}: request {i} ({item!r}) may hold only input_len, output_len, arrival_step"
            )
        try:
            req = WorkloadRequest(int(item["input_len"]), int(item["output_len"]), int(item.get("arrival_step", 0)))
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"--workload {path}: request {i} ({item!r}) needs integer input_len and output_len"
            ) from None
        if req.input_len < 1 or req.output_len < 1 or req.arrival_step < 0:
            raise ValueError(
                f"--workload {path}: request {i}: input_len and output_len must be >= 1, arrival_step >= 0; got {item!r}"
            )
        out.append(req)
    return out


def workload_from_args(args: argparse.Namespace) -> list[WorkloadRequest]:
    fixed = [args.batch_size, args.input_len, args.output_len]
    if args.workload is not None:
        if any(v is not None for v in fixed):
            raise ValueError("give either --workload or --batch-size/--input-len/--output-len, not both")
        return load_workload(args.workload)
    b = _positive("--batch-size", _DEFAULT_BATCH if args.batch_size is None else args.batch_size)
    i = _positive("--input-len", _DEFAULT_INPUT if args.input_len is None else args.input_len)
    o = _positive("--output-len", _DEFAULT_OUTPUT if args.output_len is None else args.output_len)
    return [WorkloadRequest(i, o)] * b


def load_predicted(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"--predicted {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--predicted {path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--predicted {path}: expected a JSON object of category -> seconds")
    return data


def _roofs(args: argparse.Namespace) -> Any:
    from tacit.profiler.roofline import measure_roofs, roofs_from_file

    if args.hw_json is not None:
        return roofs_from_file(Path(args.hw_json))
    if args.no_measure_hw:
        return None
    print("tacit profile: measuring this machine's roofs ...", file=sys.stderr, flush=True)
    return measure_roofs()


def _warm_up(engine: Any, requests: list[WorkloadRequest]) -> None:
    """First steps pay for oneDNN primitive creation and page faults: one prefill of the same
    prompt lengths and a decode step, not recorded."""
    from tacit.bench.workloads import random_prompts
    from tacit.sampling_params import SamplingParams

    vocab = engine.config.model.hf["vocab_size"]
    for prompt in random_prompts([r.input_len for r in requests], vocab, seed=123):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def _uncalibrated() -> str:
    """Why this CPU cannot be priced without a minutes-long fit ("" when its calibration is
    cached): the profile says so instead of fitting behind the user's back."""
    from tacit.perf_model.calibration import lookup

    _, why = lookup()
    if not why:
        return ""
    return (
        f"this CPU is not calibrated ({why}); `tacit predict --calibrate` fits it (about a minute), "
        "or --predict-hardware NAME prices on a named part"
    )


def _model_prediction(engine: Any, requests: list[WorkloadRequest], hardware: str) -> dict[str, dict[str, float]]:
    """The performance model's per-category times for this run: its batch, the mean prompt and
    output lengths (a workload of mixed lengths is priced as its mean), the weight type the
    engine holds, the KV dtype and the parallel layout."""
    from tacit.bench.latency import weight_bytes
    from tacit.perf_model.dtypes import normalize_dtype
    from tacit.perf_model.operators import Parallel
    from tacit.profiler.predicted import predicted_categories, weight_dtype_of

    cfg = engine.config
    hf = cfg.model.hf
    from tacit.perf_model.model_shape import shape_from_hf

    # The engine accepts --expert-parallel on a dense model and ignores it; predict refuses it
    # (layout.py), so it is passed only where there are experts to split.
    expert_parallel = cfg.parallel.expert_parallel and shape_from_hf(hf).is_moe
    parallel = Parallel(cfg.parallel.tensor_parallel_size, expert_parallel, cfg.parallel.data_parallel_attention)
    kv = cfg.cache.cache_dtype
    kv_dtype = normalize_dtype(str(cfg.model.dtype).removeprefix("torch.") if kv == "auto" else kv)
    return predicted_categories(
        hf,
        len(requests),
        round(sum(r.input_len for r in requests) / len(requests)),
        round(sum(r.output_len for r in requests) / len(requests)),
        weight_dtype_of(hf, weight_bytes(engine.model), parallel),
        kv_dtype,
        parallel,
        hardware,
    )


def rank_deltas(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each rank's ModelRunner.rank_stats() over the profiled steps (after - before), by rank."""
    return [{"rank": i, **{k: a[k] - b[k] for k in a}} for i, (b, a) in enumerate(zip(before, after))]


def cmd_compare(args: argparse.Namespace) -> int:
    """--compare A B: read two profiles, print the table; --out DIR: report.html and compare.json."""
    from tacit.profiler.compare import compare, format_compare, load_profile
    from tacit.profiler.html_report import render_compare

    run_flags = [f for f in ("workload", "batch_size", "input_len", "output_len") if getattr(args, f) is not None]
    if run_flags:
        given = ", ".join("--" + f.replace("_", "-") for f in run_flags)
        raise ValueError(f"--compare runs nothing: {given} describe a run to profile; give them without --compare")
    a, b = (load_profile(path) for path in args.compare)
    cmp = compare(a, b)
    print(format_compare(cmp))
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(cmp, indent=1))
        (out / "report.html").write_text(render_compare(cmp, a, b))
        print(f"wrote {out / 'compare.json'} and {out / 'report.html'}")
    return 0


def cmd_profile_diffusion(args: argparse.Namespace) -> int:
    """--model DIFFUSERS_DIR: per-block times of UNet steps and a VAE decode (profiler/diffusion.py);
    DIR/profile.json holds the rows."""
    import torch

    from tacit.perf_model.diffusion_cli import parse_size
    from tacit.profiler.diffusion import profile_diffusion, report_lines

    dtypes = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    dtype = args.dtype or "auto"
    if dtype not in dtypes:
        raise ValueError(f"--dtype {dtype!r} for a diffusion model; valid: {', '.join(dtypes)}")
    for k, v in _DIFFUSION.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    width, height = parse_size(args.size)
    roofs = _roofs(args)
    prof = profile_diffusion(
        args.model,
        width,
        height,
        args.steps,
        _positive("--repeats", args.repeats),
        args.guidance_scale > 1.0,
        dtypes[dtype],
    )
    if roofs is not None:
        prof["roofs"] = roofs.to_json()
    for line in report_lines(prof, roofs.read_Bps if roofs is not None else None):
        print(line)
    out = Path(_DEFAULT_OUT if args.out is None else args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(prof, indent=1))
    print(f"wrote {out / 'profile.json'}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    if args.compare is not None:
        return cmd_compare(args)
    from tacit.perf_model.diffusion_configs import is_diffusion_model

    if is_diffusion_model(args.model):
        if not Path(args.model).is_dir():
            raise ValueError(
                f"--model {args.model!r}: profile runs a model's weights, a diffusers directory "
                "(model_index.json, unet/, vae/); the names sdxl-base and sd15 are for tacit predict"
            )
        return cmd_profile_diffusion(args)
    given = [f"--{k.replace('_', '-')}" for k in _DIFFUSION if getattr(args, k, None) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: text-to-image flags, for --model DIFFUSERS_DIR")
    import torch

    from tacit.bench.latency import weight_bytes
    from tacit.bench.random_model import resolve_bench_model
    from tacit.engine.llm_engine import LLMEngine
    from tacit.platforms.hardware_table import hardware_names
    from tacit.profiler.collect import run_workload
    from tacit.profiler.compare import describe_device
    from tacit.profiler.html_report import render
    from tacit.profiler.roofline import model_shapes
    from tacit.profiler.summary import summarize

    requests = workload_from_args(args)
    repeats = _positive("--repeats", args.repeats)
    if args.predict_hardware not in ("none", *hardware_names()):  # before loading anything
        valid = ", ".join(["none", *hardware_names()])
        raise ValueError(f"--predict-hardware {args.predict_hardware!r} is not known; valid: {valid}")
    predicted = load_predicted(args.predicted)
    roofs = _roofs(args)
    engine_args = EngineArgs.from_cli_args(args)
    # bf16 is this CPU's fast path (and the fused decode step's dtype), as in `tacit bench`
    engine_args = replace(
        engine_args,
        model=resolve_bench_model(engine_args.model),
        dtype="bfloat16" if engine_args.dtype == "auto" else engine_args.dtype,
    )
    engine = LLMEngine(engine_args=engine_args)
    try:
        _warm_up(engine, requests)
        ranks_before = engine.executor.rank_stats()
        steps = []
        for r in range(repeats):
            steps += run_workload(engine, requests, seed=r)
        ranks = rank_deltas(ranks_before, engine.executor.rank_stats())
        model = engine.model
        meta = {
            "device": describe_device(engine.device),
            "model": {
                "name": engine.source.path.name,
                "dtype": str(engine.config.model.dtype).removeprefix("torch."),
                "num_layers": model.num_layers,
                "weight_bytes": weight_bytes(model),
            },
            "engine": {
                "tensor_parallel_size": engine.config.parallel.tensor_parallel_size,
                "fused_decode": engine.runner.fused_decode is not None,
                "block_size": engine.config.cache.block_size,
            },
            "workload": {"requests": [asdict(r) for r in requests], "repeats": repeats},
            "ranks": ranks,
        }
        if args.predicted is not None:
            meta["predicted_by"] = f"--predicted {args.predicted}"
        elif args.predict_hardware == "none":
            meta["predicted_by"] = "--predict-hardware none"
        elif engine.config.model.dtype == torch.float32:
            meta["predicted_by"] = "the performance model prices bf16/fp16 runs and quantized weights, not float32"
        elif args.predict_hardware == "this-cpu" and (uncalibrated := _uncalibrated()):
            meta["predicted_by"] = uncalibrated
        else:
            predicted = _model_prediction(engine, requests, args.predict_hardware)
            meta["predicted_by"] = f"tacit predict on {args.predict_hardware}"
        profile = summarize(steps, model_shapes(model), roofs, meta, predicted)
    finally:
        engine.shutdown()
    out = Path(_DEFAULT_OUT if args.out is None else args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(profile, indent=1))
    (out / "report.html").write_text(render(profile))
    for kind, k in profile["kinds"].items():
        cats = ", ".join(
            f"{c} {k['categories'][c]['median'] * 1e3:.2f}"
            for c in profile["categories"]
            if k["categories"][c]["mean"] > 0
        )
        print(f"{kind}: {k['steps']} steps, median {k['step_s']['median'] * 1e3:.2f} ms ({cats} ms)")
    if len(profile["ranks"]) > 1:
        n = max(len(profile["steps"]), 1)
        print(
            "ranks: "
            + "; ".join(
                f"{r['rank']}: {r['execute_s'] / n * 1e3:.2f} ms a step, {r['communication_s'] / n * 1e3:.2f} blocked"
                for r in profile["ranks"]
            )
        )
    tokens = profile["tokens"]
    print(f"tokens: {tokens['computed']} computed, {tokens['cached']} prompt tokens from the prefix cache")
    print(f"wrote {out / 'profile.json'} and {out / 'report.html'}")
    return 0
