"""`tacit predict --serve --workload FILE`: the flags to a simulated serving run, and its report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tacit.bench.serve import parse_slo
from tacit.bench.workload_file import load_workload
from tacit.config import SchedulerConfig
from tacit.config.engine_args import EngineArgs
from tacit.config.model import model_max_len
from tacit.memory.swap import SwapSpace
from tacit.perf_model.calibration import profile_for
from tacit.perf_model.fit_host import priced_dtypes
from tacit.perf_model.hardware_file import resolve_hardware
from tacit.perf_model.layout import place, resolve_layout
from tacit.perf_model.layout_cli import layout_from_args
from tacit.perf_model.memory import kv_bytes_per_token
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.serve_sim import KVPool, kv_pool_from_memory, roofline_pricer, simulate, summarize
from tacit.perf_model.step_model import Pricing


def _scheduler_config(args: argparse.Namespace, max_model_len: int) -> SchedulerConfig:
    """The engine's SchedulerConfig from the same flags (max_model_len: the model's, to which
    --no-chunked-prefill raises the budget, as the engine does); what the simulator cannot
    replay is refused by name rather than ignored."""
    cfg = EngineArgs.scheduler_config_from_cli(args, max_model_len=max_model_len)
    if cfg.preemption_mode == "swap" and not args.swap_space:
        raise ValueError("--preemption-mode swap needs --swap-space GiB (and --swap-bandwidth GB/s)")
    return cfg


def _swap_space(args: argparse.Namespace, pricing: Pricing, pool: KVPool) -> SwapSpace | None:
    """--swap-space GiB at --swap-bandwidth GB/s, in blocks of the pool's size; None without."""
    if args.swap_space < 0 or (args.swap_bandwidth is not None and args.swap_bandwidth <= 0):
        raise ValueError(f"--swap-space {args.swap_space} and --swap-bandwidth {args.swap_bandwidth} must be positive")
    if not args.swap_space:
        return None
    if args.swap_bandwidth is None:
        raise ValueError("--swap-space needs --swap-bandwidth GB/s: the host copy speed the swaps are priced at")
    block_bytes = pool.block_size * kv_bytes_per_token(pricing.shape, pricing.parallel, pricing.kv_dtype)
    return SwapSpace(int(args.swap_space * (1 << 30)) // block_bytes, block_bytes, args.swap_bandwidth * 1e9)


# One prediction's flags that a replay has no use for, and why: the workload file gives each
# request's lengths, and the simulator replays neither speculative decoding nor the prefix cache
# (cli.py refuses each one set away from its default by name rather than ignoring it).
NOT_REPLAYED = {
    "batch_size": "the workload file gives the requests",
    "request_rate": "the workload file gives each request's arrival",
    "input_len": "the workload file gives each request's prompt",
    "output_len": "the workload file gives each request's output",
    "prefix_hit_rate": "the replay does not model the prefix cache",
    "speculative_tokens": "the replay does not model speculative decoding",
    "acceptance": "the replay does not model speculative decoding",
    "speculative_method": "the replay does not model speculative decoding",
    "ops": "the replay prints percentiles, not one step's operators",
    "attention": "the replay prints percentiles, not one step's attention",
}


def cmd_serve(args: argparse.Namespace) -> int:
    if args.model is None or args.workload is None:
        raise ValueError("--serve needs --model and --workload FILE")
    if not 0 < args.memory_utilization <= 1:
        raise ValueError(f"--memory-utilization must be in (0, 1], got {args.memory_utilization}")
    slo = parse_slo(args.slo)
    workload = load_workload(args.workload)  # bad lines fail before anything is sized
    spec = resolve_hardware(
        args.hardware, args.hardware_file, args.enforce_eager, args.efficiency_profile, args.threads
    )
    hf = load_hf_config(args.model)
    shape = shape_from_hf(hf)
    if args.data_parallel_attention:
        raise ValueError(
            "--serve does not model --data-parallel-attention: its simulator keeps one KV pool for all "
            "sequences; predict one step without --serve"
        )
    par = layout_from_args(args)
    if par.dp > 1 or par.pp > 1:
        raise ValueError(
            "--serve simulates one engine's KV pool: it does not take --data-parallel-size or "
            "--pipeline-parallel-size; predict one step without --serve"
        )
    par, spec = place(resolve_layout(par, shape), spec)
    wdt, kvdt = priced_dtypes(spec, args.quantization, args.kv_cache_dtype, shape.weight_format)
    # tacit's engine: where its decodes run on torch_paged, padded to each group's longest context
    pricing = Pricing(
        shape,
        spec,
        profile_for(spec),
        wdt,
        kvdt,
        args.quantization_group_size,
        par,
        padded_decode_block=args.block_size,
        activation_dtype=args.activation_dtype,
    )
    # a request past the model's length is priced as if the model took it (the engine refuses it)
    longest = max((w.input_len + w.output_len for w in workload), default=1)
    cfg = _scheduler_config(args, max(longest, model_max_len(hf)))
    if args.kv_blocks is not None:
        if args.kv_blocks < 1:
            raise ValueError(f"--kv-blocks must be >= 1, got {args.kv_blocks}")
        pool = KVPool(args.kv_blocks, args.block_size)
    else:
        pool = kv_pool_from_memory(
            pricing, cfg.max_num_batched_tokens, args.memory_utilization, args.block_size, workload
        )
    # Layer boundaries where urgent prompts cut in; none across ranks, as the multi-process
    # executor runs every step whole (engine/executor.py).
    boundaries = pricing.shape.num_layers if par.tp == 1 else 1
    sim = simulate(workload, roofline_pricer(pricing), pool, cfg, _swap_space(args, pricing, pool), boundaries)
    out = summarize(sim, slo)
    out["kv_pool"] = {"blocks": pool.num_blocks, "block_size": pool.block_size, "tokens": pool.capacity_tokens}
    print(
        f"{args.model} on {spec.name}, TP={par.tp}{' EP' if par.ep else ''}, weights {pricing.weight_dtype}, "
        f"KV {pricing.kv_dtype}; {len(workload)} requests from {args.workload}; policy {cfg.policy}, "
        f"max_num_seqs {cfg.max_num_seqs}, max_num_batched_tokens {cfg.max_num_batched_tokens}"
    )
    print(f"  KV pool     {pool.num_blocks} blocks x {pool.block_size} = {pool.capacity_tokens} tokens per device")
    print(
        f"  completed   {out['completed']} (failed/rejected {out['failed']}) in {out['duration_s']:.2f} s simulated, "
        f"{out['num_steps']} steps, {out['num_preemptions']} preemptions ({out['num_swapped_out']} by swap), {out['num_cut_ins']} cut-ins, busy {100 * out['busy_fraction']:.0f}%"
    )
    print(f"  throughput  {out['request_throughput']:.2f} req/s, {out['output_tok_s']:.1f} output tok/s")
    if slo:
        bounds = ",".join(f"{k}:{v:g}" for k, v in out["slo"].items())
        print(f"  goodput     {out['goodput_req_s']:.2f} req/s meeting {bounds} (ms)")
    print(f"  {'ms':<6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        st = out[key]
        print(f"  {key[:-3].upper():<6}" + "".join(f"{st[q]:>10.2f}" for q in ("mean", "p50", "p90", "p99")))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0
