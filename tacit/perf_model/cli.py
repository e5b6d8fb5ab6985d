"""`tacit predict`: TTFT, TPOT, throughput and memory of a model on a piece of hardware, from
the roofline model; `--validate` runs the real engine on this machine against it."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from tacit.config import SchedulerConfig
from tacit.config.engine_args import EngineArgs
from tacit.config.model import model_max_len
from tacit.perf_model.diffusion_cli import add_diffusion_args
from tacit.perf_model.dtypes import (
    ACTIVATION_DTYPES,
    KV_DTYPES,
    activation_dtype,
    normalize_dtype,
    resolve_weight_format,
)
from tacit.perf_model.fit_host import priced_dtypes
from tacit.perf_model.ggml_mixes import GGML_TYPES
from tacit.perf_model.layout_cli import add_layout_args, layout_from_args
from tacit.perf_model.prediction_print import print_bottlenecks, print_ops, print_prediction
from tacit.platforms.specs import HardwareSpec

QUANTIZATION_HELP = (
    "weights: auto (the checkpoint's quantization_config, bf16 without one) | bf16 | fp16 | fp8 (e4m3, a scale "
    "per 128x128 block: DeepSeek's) | w8a8_fp8 | w8a8_int8 (per-channel scales, 8-bit activations) | int8 "
    "(tacit's own: GGML Q8_0, 34 bytes per 32 values, not per-channel W8A8) | int4 (tacit's own: GGML Q4_1) | "
    "w4a16 | awq | gptq (int4 in groups of 128) | mxfp4 (MoE experts) | llama.cpp's: " + " ".join(GGML_TYPES)
)


def add_predict_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict TTFT/TPOT/memory of a model on a hardware spec (no weights loaded)")
    p.add_argument(
        "--model",
        default=None,
        help="config.json or its directory, a recipes/configs name, random:NAME; or a text-to-image model: "
        "sdxl-base | sd15 | a diffusers directory (model_index.json)",
    )
    p.add_argument("--hardware", default="this-cpu", help="a tacit.platforms.specs name (see the error for the list)")
    p.add_argument(
        "--hardware-file", default=None, help="YAML/JSON describing a machine not in the table (hardware_file.py)"
    )
    p.add_argument(
        "--efficiency-profile",
        default=None,
        help="price the part with this efficiency profile (an engine's, efficiency.json) instead of its own, e.g. "
        "granite-rapids-llamacpp-mainline for llama.cpp on a Xeon 6900P (granite-rapids-llamacpp: ik_llama.cpp), "
        "whose entry is SGLang's",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="a CPU engine's compute threads (llama.cpp's -t): its compute priced at min(N, cores) of the part's "
        "cores; its memory bandwidth as the profile's, measured with every core (default: all the cores)",
    )
    p.add_argument(
        "--enforce-eager", action="store_true", help="price kernel launches without CUDA/ACL graphs (vLLM's flag)"
    )
    add_layout_args(p)
    p.add_argument("--quantization", default="auto", help=QUANTIZATION_HELP)
    p.add_argument(
        "--activation-dtype",
        default="auto",
        help=f"the quantized linears' activations: {' | '.join(ACTIVATION_DTYPES)} (auto: the format's usual one: "
        "8-bit for w8a8_* and llama.cpp's types; fp8 for block fp8 on parts with fp8 units, else bf16 (W8A16))",
    )
    p.add_argument("--quantization-group-size", type=int, default=32, help="int4 values per scale: 32 | 64 | 128")
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help=f"auto | {' | '.join(KV_DTYPES)} (auto: the weights' float dtype where they are unquantized fp32, else bf16)",
    )
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="requests a second arriving as a Poisson process (vLLM's benchmark_serving flag: an open loop): TTFT "
        "with its wait, the served TPOT and the concurrency that rate reaches, instead of --batch-size requests",
    )
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (0: no prefill, decode from --context)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help="price the decode step with this many tokens cached per sequence (TPOT and throughput at it), "
        "not the mean over the output; needed with --input-len 0",
    )
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
        help="ngram | suffix (drafts cost a lookup) | mtp (the model's MTP layer and the head a draft)",
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
        "--published",
        action="store_true",
        help="predict every published figure in perf_model/data/published.yaml; error by category (--json: rows)",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="fit this machine's efficiency profile now (one to two minutes; cached, and made anyway on first use of "
        "this-cpu or --validate); alone: only that",
    )
    p.add_argument(
        "--plot", default=None, help="with --validate: predicted against measured, one point per case (PNG; matplotlib)"
    )
    add_diffusion_args(p)
    sv = p.add_argument_group("--serve: replay tacit's scheduler over a workload file on a simulated clock")
    sv.add_argument("--serve", action="store_true", help="simulate serving --workload (TTFT/TPOT/E2E percentiles)")
    sv.add_argument("--workload", default=None, help='JSONL: {"arrival_s", "input_len", "output_len", "priority"}')
    sv.add_argument("--slo", default=None, help="goodput bounds as tacit bench serve's, e.g. ttft:500,tpot:50 (ms)")
    # The engine's own scheduler flags (policy, budgets, --slo-class, aging, ...), one definition:
    # --serve replays them, and one prediction's TTFT chunks its batch's prompts by them.
    sc = p.add_argument_group(
        "the engine's scheduler: --serve's, and one prediction's TTFT (its batch arriving at once; "
        "--max-num-seqs defaults to the batch there)"
    )
    EngineArgs.add_section_cli_args(sc, ("scheduler",))
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


def predict_parser() -> argparse.ArgumentParser:
    """`tacit predict`'s parser alone: --published parses each figure's arguments with it."""
    parser = argparse.ArgumentParser(prog="tacit")
    add_predict_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def _check_choice(value: str, valid: tuple[str, ...], flag: str) -> str:
    if value not in valid:
        raise ValueError(f"{flag} {value!r} is not known; valid: {', '.join(valid)}")
    return value


def _predict_defaults() -> dict:
    return vars(predict_parser().parse_args(["predict"]))


def _refuse_set(args: argparse.Namespace, mode: str, reasons: dict[str, str]) -> None:
    """A mode refuses, by name, each flag of `reasons` (dest -> why the mode has no use for it)
    that is set away from its default, rather than ignoring it."""
    defaults = _predict_defaults()
    for key, why in reasons.items():
        if getattr(args, key, defaults[key]) != defaults[key]:
            raise ValueError(f"--{key.replace('_', '-')} does not go with {mode}: {why}")


def _all_flags_but(used: tuple[str, ...], why: str) -> dict[str, str]:
    """Every flag of one prediction but `used`, each with `why`: a mode that runs its own commands."""
    return {k: why for k in _predict_defaults() if k not in (*used, "command", "func")}


def cmd_predict(args: argparse.Namespace) -> int:
    if args.plot is not None and not args.validate:
        raise ValueError("--plot draws --validate's cases; for one prediction's charts use --html FILE")
    if args.html is not None and (args.validate or args.serve):
        raise ValueError("--html draws one prediction's steps; it does not go with --validate or --serve")
    for flag, value in (("--efficiency-profile", args.efficiency_profile), ("--threads", args.threads)):
        if value is not None and (args.validate or args.published):
            raise ValueError(
                f"{flag} prices one prediction or a --serve replay; --validate measures this machine "
                "against its own fit, and --published runs each figure's own command"
            )
    if args.published:
        from tacit.perf_model.published import run_published

        _refuse_set(
            args, "--published", _all_flags_but(("published", "json"), "--published runs each figure's own command")
        )
        return run_published(args.json, predict_parser())
    if args.context is not None and (args.validate or args.serve):
        raise ValueError("--context prices one prediction's decode step; it does not go with --validate or --serve")
    if args.calibrate and not args.validate and args.hardware != "this-cpu":
        raise ValueError(f"--calibrate fits this machine (--hardware this-cpu or --validate), not {args.hardware!r}")
    if args.validate:
        used = ("validate", "json", "plot", "calibrate")
        _refuse_set(args, "--validate", _all_flags_but(used, "--validate measures its own cases on this machine"))
        from tacit.perf_model.validate import run_validation
        from tacit.plotting import require_plotting

        require_plotting(args.plot)  # before the ~30 measured configurations, not after
        return run_validation(args.json, args.plot, refit=args.calibrate)
    if args.calibrate:
        from tacit.perf_model.calibration import calibrate

        calibrate()
        if args.model is None and not args.serve:
            return 0
    from tacit.perf_model.diffusion_configs import is_diffusion_model

    if is_diffusion_model(args.model) and not args.serve:
        from tacit.perf_model.diffusion_cli import cmd_predict_diffusion

        return cmd_predict_diffusion(args)
    from tacit.perf_model.diffusion_cli import refuse_diffusion_args

    refuse_diffusion_args(args)
    if args.serve:
        from tacit.perf_model.serve_cli import NOT_REPLAYED, cmd_serve

        _refuse_set(args, "--serve", NOT_REPLAYED)
        return cmd_serve(args)
    from tacit.perf_model.attention_report import attention_lines, kv_lines
    from tacit.perf_model.hardware_file import resolve_hardware
    from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
    from tacit.perf_model.predict import Workload, predict

    if args.model is None:
        raise ValueError("--model is required (a config.json, a recipes/configs name, or random:NAME)")
    resolve_weight_format(args.quantization, "")  # a bad name fails before the model is read
    _check_choice(args.activation_dtype, ACTIVATION_DTYPES, "--activation-dtype")
    _check_choice(normalize_dtype(args.kv_cache_dtype), KV_DTYPES, "--kv-cache-dtype")
    spec = resolve_hardware(  # before the model: fails fast
        args.hardware, args.hardware_file, args.enforce_eager, args.efficiency_profile, args.threads
    )
    hf = load_hf_config(args.model)
    shape = shape_from_hf(hf)
    wdt, kvdt = priced_dtypes(spec, args.quantization, args.kv_cache_dtype, shape.weight_format)
    activation_dtype(wdt, args.activation_dtype, fp8_units="fp8" in spec.flops)  # a bad pairing fails here
    if args.request_rate is not None:
        _refuse_set(
            args,
            "--request-rate",
            {"batch_size": "the rate gives the concurrency (a closed loop of N: --batch-size N)"},
        )
    work = Workload(
        args.batch_size,
        args.input_len,
        args.output_len,
        wdt,
        kvdt,
        args.quantization_group_size,
        layout_from_args(args),
        prefix_hit_rate=args.prefix_hit_rate,
        speculative_tokens=args.speculative_tokens,
        acceptance=args.acceptance,
        speculative_method=args.speculative_method,
        activation_dtype=args.activation_dtype,
        context=args.context,
        scheduler=_batch_scheduler(args, spec, model_max_len(hf)),
        request_rate=args.request_rate,
    )
    pred = predict(shape, spec, work)
    heading = print_prediction(args, spec, work, pred)
    if args.attention:
        for line in kv_lines(shape, work.parallel, kvdt, work.kv_tokens):
            print(line)
        for line in attention_lines(pred.decode_ops, pred.decode_context):
            print(line)
    print_bottlenecks(pred)
    if args.ops:
        print_ops(pred, bool(work.speculative_tokens))
    if args.json:
        from tacit.perf_model.prediction_json import prediction_json

        Path(args.json).write_text(json.dumps(prediction_json(pred, work, spec, shape, args), indent=2))
    if args.html:
        from tacit.perf_model.predict_html import render_prediction

        Path(args.html).write_text(render_prediction(pred, spec, heading, bool(work.speculative_tokens)))
    return 0


# The serving engines' scheduler defaults on accelerators, for the TTFT of a part tacit does not
# run on: vLLM V1's OpenAI server chunks prefill at 8192 tokens a step (its LLM class at 16384)
# and caps no single prompt (long_prefill_token_threshold 0 unless several partial prefills run);
# SGLang's chunked_prefill_size is 8192 on 80 GB GPUs. tacit's own defaults (2048 tokens a
# step, 512 a long prompt) were set for this 2-core CPU: on an H100 they would price a
# 16 x 8192-token batch as 241 steps.
ACCELERATOR_SCHEDULER = {"max_num_batched_tokens": 8192, "long_prefill_token_threshold": 0}


def _batch_scheduler(args: argparse.Namespace, spec: HardwareSpec, max_model_len: int) -> SchedulerConfig:
    """The engine's scheduler from its flags, for the batch's TTFT; --max-num-seqs, unless
    given, holds the whole batch (the batch the decode step prices runs together). On any part
    but this-cpu (where tacit's engine runs), the flags not given take ACCELERATOR_SCHEDULER's."""
    longest = max(args.input_len, args.context or 0) + args.output_len
    from tacit.perf_model.step_model import runs_tacit_engine

    if not runs_tacit_engine(spec):
        given = {k: getattr(args, k, None) for k in ACCELERATOR_SCHEDULER}
        args = argparse.Namespace(
            **{**vars(args), **{k: v if given[k] is None else given[k] for k, v in ACCELERATOR_SCHEDULER.items()}}
        )
    # --no-chunked-prefill raises the budget to the model's max_model_len, as the engine does (a
    # prompt past it priced as if the model took it)
    cfg = EngineArgs.scheduler_config_from_cli(args, max_model_len=max(longest, max_model_len))
    if args.max_num_seqs is None:
        cfg = replace(cfg, max_num_seqs=max(cfg.max_num_seqs, args.batch_size))
    return cfg
