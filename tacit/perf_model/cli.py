"""`tacit predict`: TTFT, TPOT, throughput and memory of a model on a piece of hardware, from
the roofline model; `--validate` runs the real engine on this machine against it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tacit.config.engine_args import EngineArgs
from tacit.perf_model.dtypes import KV_DTYPES, WEIGHT_DTYPES, normalize_dtype


def add_predict_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict TTFT/TPOT/memory of a model on a hardware spec (no weights loaded)")
    p.add_argument("--model", default=None, help="config.json or its directory, a recipes/configs name, or random:NAME")
    p.add_argument("--hardware", default="this-cpu", help="a tacit.platforms.specs name (see the error for the list)")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--expert-parallel", action="store_true", help="MoE experts split whole across the TP devices")
    p.add_argument(
        "--data-parallel-attention",
        action="store_true",
        help="attention whole on each TP device over 1/N of the sequences (their KV only); MLPs, experts, "
        "embedding and head split as before",
    )
    p.add_argument("--quantization", default="bf16", help=f"weights: {' | '.join(WEIGHT_DTYPES)} (none/auto: bf16)")
    p.add_argument("--quantization-group-size", type=int, default=32, help="int4 values per scale: 32 | 64 | 128")
    p.add_argument("--kv-cache-dtype", default="bf16", help=f"{' | '.join(KV_DTYPES)} (auto: bf16)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument(
        "--prefix-hit-rate",
        type=float,
        default=0.0,
        help="share of each prompt found in the prefix cache (attended over, not prefilled), in [0, 1)",
    )
    p.add_argument("--speculative-tokens", type=int, default=0, help="draft tokens verified a step (0: none)")
    p.add_argument(
        "--acceptance", type=float, default=0.0, help="probability a draft is accepted given the ones before it were"
    )
    p.add_argument(
        "--speculative-method",
        default="ngram",
        help="ngram | suffix (drafts cost a lookup) | mtp (a decoder layer and the head a draft)",
    )
    p.add_argument("--json", default=None, help="write the prediction (or the validation) here")
    p.add_argument("--ops", action="store_true", help="also print every operator's time (compute / memory / link)")
    p.add_argument(
        "--attention",
        action="store_true",
        help="also print the KV cache a token (and a sequence, with sliding windows) and the decode step's "
        "attention time per layer and per step",
    )
    p.add_argument("--html", default=None, help="write the step charts (operator classes, roofline) as one HTML file")
    p.add_argument("--validate", action="store_true", help="measure the real engine on this CPU against the model")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="fit this machine's efficiency profile now (about a minute; cached, and made anyway on first use of "
        "this-cpu or --validate); alone: only that",
    )
    p.add_argument(
        "--plot", default=None, help="with --validate: predicted against measured, one point per case (PNG; matplotlib)"
    )
    sv = p.add_argument_group("--serve: replay tacit's scheduler over a workload file on a simulated clock")
    sv.add_argument("--serve", action="store_true", help="simulate serving --workload (TTFT/TPOT/E2E percentiles)")
    sv.add_argument("--workload", default=None, help='JSONL: {"arrival_s", "input_len", "output_len", "priority"}')
    sv.add_argument("--slo", default=None, help="goodput bounds as tacit bench serve's, e.g. ttft:500,tpot:50 (ms)")
    # The engine's own scheduler flags (policy, budgets, --slo-class, aging, ...), one definition.
    EngineArgs.add_section_cli_args(sv, ("scheduler",))
    sv.add_argument("--kv-blocks", type=int, default=None, help="KV pool blocks (default: sized from memory)")
    sv.add_argument("--block-size", type=int, default=16)
    sv.add_argument("--memory-utilization", type=float, default=0.9, help="share of device memory the engine uses")
    sv.add_argument("--swap-space", type=float, default=0.0, help="GiB of host memory for swapped KV (0: recompute)")
    sv.add_argument(
        "--swap-bandwidth",
        type=float,
        default=None,
        help="GB/s of a KV copy to host and back (e.g. PCIe); with --swap-space",
    )
    p.set_defaults(func=cmd_predict)


def _check_choice(value: str, valid: tuple[str, ...], flag: str) -> str:
    if value not in valid:
        raise ValueError(f"{flag} {value!r} is not known; valid: {', '.join(valid)}")
    return value


def cmd_predict(args: argparse.Namespace) -> int:
    if args.plot is not None and not args.validate:
        raise ValueError("--plot draws --validate's cases; for one prediction's charts use --html FILE")
    if args.html is not None and (args.validate or args.serve):
        raise ValueError("--html draws one prediction's steps; it does not go with --validate or --serve")
    if args.calibrate and not args.validate and args.hardware != "this-cpu":
        raise ValueError(f"--calibrate fits this machine (--hardware this-cpu or --validate), not {args.hardware!r}")
    if args.validate:
        from tacit.perf_model.validate import run_validation
        from tacit.plotting import require_plotting

        require_plotting(args.plot)  # before the ~30 measured configurations, not after
        return run_validation(args.json, args.plot, refit=args.calibrate)
    if args.calibrate:
        from tacit.perf_model.calibration import calibrate

        calibrate()
        if args.model is None and not args.serve:
            return 0
    if args.serve:
        from tacit.perf_model.serve_cli import cmd_serve

        return cmd_serve(args)
    from tacit.perf_model.attention_report import attention_lines, kv_lines
    from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
    from tacit.perf_model.operators import Parallel
    from tacit.perf_model.predict import Workload, predict
    from tacit.platforms.hardware_table import get_hardware_spec

    if args.model is None:
        raise ValueError("--model is required (a config.json, a recipes/configs name, or random:NAME)")
    if args.tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}")
    if args.data_parallel_attention and args.tensor_parallel_size < 2:
        raise ValueError("--data-parallel-attention needs --tensor-parallel-size >= 2: it spreads sequences over them")
    wdt = _check_choice(normalize_dtype(args.quantization), WEIGHT_DTYPES, "--quantization")
    kvdt = _check_choice(normalize_dtype(args.kv_cache_dtype), KV_DTYPES, "--kv-cache-dtype")
    spec = get_hardware_spec(args.hardware)  # before the model: a bad name fails fast
    shape = shape_from_hf(load_hf_config(args.model))
    work = Workload(
        args.batch_size,
        args.input_len,
        args.output_len,
        wdt,
        kvdt,
        args.quantization_group_size,
        Parallel(args.tensor_parallel_size, args.expert_parallel, args.data_parallel_attention),
        prefix_hit_rate=args.prefix_hit_rate,
        speculative_tokens=args.speculative_tokens,
        acceptance=args.acceptance,
        speculative_method=args.speculative_method,
    )
    pred = predict(shape, spec, work)
    out = pred.as_json()
    heading = (
        f"{args.model} on {spec.name} ({spec.description}), TP={work.parallel.tp}{' EP' if work.parallel.ep else ''}"
        f"{' DP-attention' if work.parallel.dp_attention else ''}, "
        f"weights {wdt}, KV {kvdt}, batch {work.batch}, input {work.input_len}"
        f"{f' ({work.cached_tokens} cached)' if work.cached_tokens else ''}, output {work.output_len}"
        + (
            f", {work.speculative_method} drafts {work.speculative_tokens} a step at acceptance {work.acceptance} "
            f"({work.tokens_per_verify:.2f} tokens a verify)"
            if work.speculative_tokens
            else ""
        )
    )
    print(heading)
    print(f"  TTFT        {out['ttft_ms']:.2f} ms")
    print(f"  TPOT        {out['tpot_ms']:.3f} ms")
    print(f"  throughput  {out['throughput_tok_s']:.1f} output tok/s")
    mem = pred.memory
    print(
        f"  memory      {out['memory_per_device_gb']:.2f} GB per device (weights {mem.weights / 1e9:.2f}, "
        f"KV {mem.kv_cache / 1e9:.2f}, activations {mem.activations / 1e9:.2f}) of "
        f"{pred.capacity_bytes / 1e9:.1f}: {'fits' if pred.fits else 'does NOT fit'}"
    )
    if args.attention:
        for line in kv_lines(shape, work.parallel, kvdt, work.input_len + work.output_len):
            print(line)
        for line in attention_lines(pred.decode_ops, pred.decode_context):
            print(line)
    print("  bottlenecks:")
    for k, v in out["bottlenecks"].items():
        print(f"    {k}: {v}")
    if args.ops:
        _print_ops("prefill", pred.prefill_ops, pred.ttft_s)
        _print_ops("verify" if work.speculative_tokens else "decode", pred.decode_ops, pred.decode_step_s)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if args.html:
        from tacit.perf_model.predict_html import render_prediction

        Path(args.html).write_text(render_prediction(pred, spec, heading, bool(work.speculative_tokens)))
    return 0


def _print_ops(phase: str, times: list, step_s: float) -> None:
    """Each operator of one step: its time, the compute and memory (or link) time it is the max of."""
    ops_s = sum(t.seconds for t in times)
    print(f"  {phase} operators (step {1e3 * step_s:.3f} ms; operators {1e3 * ops_s:.3f}, the rest fixed overhead):")
    print(f"    {'operator':<20}{'class':<18}{'ms':>10}{'compute ms':>12}{'memory/link ms':>16}  bound")
    for t in times:
        print(
            f"    {t.op.name:<20}{t.op.op_class:<18}{1e3 * t.seconds:>10.3f}{1e3 * t.compute_s:>12.3f}"
            f"{1e3 * t.memory_s:>16.3f}  {t.bound}"
        )
