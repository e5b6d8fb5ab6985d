"""`tacit bench latency | throughput`: tacit's engine driven offline, beside the peers named
with --peer (cli_peers.py): TTFT and decode tok/s per batch size, and output tok/s over a
workload of N requests."""

from __future__ import annotations

import argparse
from pathlib import Path

from tacit.bench.cli_output import log, print_ratios, table, write_json
from tacit.bench.cli_peers import PEERS, check_peers, report_failed_peers, setup_engines
from tacit.bench.peers.process_peer import DEFAULT_TIMEOUT_S
from tacit.bench.workloads import DISTRIBUTIONS
from tacit.engine.arg_utils import EngineArgs


def add_engine_parsers(bsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The latency and throughput parsers; returns latency's (what `tacit bench` alone runs)."""
    lat = bsub.add_parser("latency", help="TTFT and decode tok/s per batch size")
    EngineArgs.add_cli_args(lat)
    lat.add_argument("--batch-sizes", default="1,4,16")
    lat.add_argument("--input-len", type=int, default=128)
    lat.add_argument("--output-len", type=int, default=64)
    lat.add_argument("--peer", action="append", default=[], help=f"measure a peer in the same run: {', '.join(PEERS)}")
    lat.add_argument("--repeats", type=int, default=2)
    lat.add_argument(
        "--peer-timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds a peer may take per measurement"
    )
    lat.add_argument("--json", default=None)
    lat.add_argument("--plot", default=None, help="PNG: decode tok/s against batch size")
    lat.set_defaults(func=cmd_latency)
    tp = bsub.add_parser("throughput", help="offline throughput over N requests")
    EngineArgs.add_cli_args(tp)
    tp.add_argument("--num-prompts", type=int, default=256)
    tp.add_argument("--dist", default="longtail", choices=DISTRIBUTIONS)
    tp.add_argument("--input-len", type=int, default=128, help="median (longtail) or mean input length")
    tp.add_argument("--output-len", type=int, default=64)
    tp.add_argument("--peer", action="append", default=[], help=f"{', '.join(PEERS)} or transformers-cb")
    tp.add_argument("--static-batch", type=int, default=16, help="transformers generate() batch size")
    tp.add_argument(
        "--peer-timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds a peer may take per measurement"
    )
    tp.add_argument("--repeats", type=int, default=1)
    tp.add_argument("--json", default=None)
    tp.add_argument("--plot", default=None, help="PNG: output tok/s per engine")
    tp.set_defaults(func=cmd_throughput)
    sp = bsub.add_parser("spec", help="decode tok/s with speculative decoding against without (docs/workloads)")
    EngineArgs.add_cli_args(sp)
    sp.add_argument(
        "--cases",
        default="repetitive:1,chat:1,mixed:16",
        help="workload:batch pairs; workloads: " + ", ".join(("repetitive", "chat", "mixed")),
    )
    sp.add_argument(
        "--workload",
        default=None,
        help="JSONL of {kind: repetitive|chat, messages: [...]} (default: docs/workloads/spec-decode.jsonl)",
    )
    sp.add_argument("--output-len", type=int, default=256)
    sp.add_argument("--repeats", type=int, default=3)
    sp.add_argument("--peer", action="append", default=[], choices=["llama.cpp"], help="llama.cpp: also with lookup")
    sp.add_argument("--lookup-tokens", default="2,4,10", help="llama.cpp's prompt-lookup num_pred_tokens to try")
    sp.add_argument("--peer-timeout", type=float, default=DEFAULT_TIMEOUT_S)
    sp.add_argument("--json", default=None)
    sp.add_argument("--plot", default=None, help="PNG: median decode tok/s per workload and engine")
    sp.set_defaults(func=cmd_spec)
    return lat


def cmd_latency(args: argparse.Namespace) -> int:
    from tacit.bench import latency
    from tacit.bench.plot import require_plotting
    from tacit.platforms.hw_probe import peak_read_bandwidth

    require_plotting(args.plot)
    check_peers(args.peer)
    log("measuring read bandwidth ...")
    bw = peak_read_bandwidth() / 1e9
    engine, engines, load = setup_engines(args, args.peer)
    wbytes = latency.weight_bytes(engine.model)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    rows = latency.run(
        engines,
        sizes,
        args.input_len,
        args.output_len,
        engine.config.model.hf["vocab_size"],
        lambda bs: latency.active_weight_bytes(engine.model, bs),
        bw,
        repeats=args.repeats,
        progress=log,
    )
    active = latency.active_weight_bytes(engine.model, 1)
    print(
        f"model {engine.source.path.name}, {engine.config.model.dtype}, weights {wbytes / 1e6:.0f} MB"
        + (f" ({active / 1e6:.0f} MB active per token)" if active != wbytes else "")
        + f", peak read bandwidth {bw:.1f} GB/s, input {args.input_len}, output {args.output_len}"
    )
    print(f"tacit loaded in {load['load_s']:.2f} s; resident memory after load {load['rss_after_load_mb']:.0f} MB")
    print(table(rows))
    r = latency.ratios(rows, "decode_tok_s", "batch_size")
    print_ratios(r)
    failed = report_failed_peers(engines)
    experts = {}
    if engine.runner.expert_cache is not None:  # --expert-cache-memory: the whole run's counters
        experts = engine.runner.expert_cache.stats.as_dict()
        print("streamed experts: " + ", ".join(f"{k.removeprefix('expert_')} {v:.3g}" for k, v in experts.items()))
    write_json(args, {"read_GBps": bw, "weight_bytes": wbytes, **load, "rows": rows, "ratios": r, **experts, **failed})
    if args.plot:
        from tacit.bench.plot import plot_lines

        plot_lines(rows, "batch_size", "decode_tok_s", args.plot, "decode tok/s by batch size")
    return 0


def cmd_throughput(args: argparse.Namespace) -> int:
    from tacit.bench import throughput
    from tacit.bench.plot import require_plotting

    require_plotting(args.plot)
    check_peers(args.peer)
    engine, engines, _ = setup_engines(args, args.peer)
    rows = throughput.run(
        engines,
        args.num_prompts,
        args.dist,
        args.input_len,
        args.output_len,
        engine.config.model.hf["vocab_size"],
        engine.max_model_len,
        args.repeats,
        progress=log,
    )
    print(f"model {engine.source.path.name}, {engine.config.model.dtype}, {args.num_prompts} requests, {args.dist}")
    print(table(rows))
    r = {f"tacit/{row['engine']}": rows[0]["output_tok_s"] / row["output_tok_s"] for row in rows[1:]}
    print_ratios(r)
    failed = report_failed_peers(engines)
    write_json(args, {"rows": rows, "ratios": r, **failed})
    if args.plot:
        from tacit.bench.plot import plot_bars

        plot_bars(rows, "output_tok_s", args.plot, f"output tok/s, {args.num_prompts} {args.dist} requests")
    return 0


# 3 drafts: with its last token a batch-1 verify is 4 rows, the most the GGML int8 GEMVs run
# with each row summed as alone (5-8 rows take the bf16 path, which rounds otherwise and on the
# default model's Q4_1 weights costs 2x: docs/speculative_decoding.md).
DEFAULT_SPECULATIVE_CONFIG = {"method": "ngram", "num_speculative_tokens": 3}


def cmd_spec(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from tacit.bench import spec_decode
    from tacit.bench.plot import require_plotting

    require_plotting(args.plot)
    from tacit.bench.peers.process_peer import ProcessPeer
    from tacit.bench.random_model import resolve_bench_model
    from tacit.engine.llm_engine import LLMEngine

    cases = []
    for item in args.cases.split(","):
        kind, _, size = item.partition(":")
        if kind not in spec_decode.KINDS or not size.isdigit() or int(size) < 1:
            raise ValueError(
                f"--cases {item!r} is invalid: workload:batch, workload one of {', '.join(spec_decode.KINDS)}"
            )
        cases.append((kind, int(size)))
    base = EngineArgs.from_cli_args(args)
    base = replace(base, model=resolve_bench_model(base.model))  # --dtype auto: the platform's fast dtype
    spec = base.speculative_config or DEFAULT_SPECULATIVE_CONFIG
    log(f"loading tacit twice: speculation off, and on with {spec} ...")
    engines = {
        "off": LLMEngine(engine_args=replace(base, speculative_config=None)),
        "on": LLMEngine(engine_args=replace(base, speculative_config=spec)),
    }
    prompts = spec_decode.load_prompts(engines["off"].tokenizer, Path(args.workload or spec_decode.WORKLOAD))
    peers = []
    if args.peer:
        gguf = engines["off"].source.path
        if gguf.suffix != ".gguf":
            raise ValueError(f"--peer llama.cpp needs a .gguf --model (both run the same file); got {gguf}")
        n_ctx = engines["off"].max_model_len
        factory = "tacit.bench.peers.llamacpp_peer:LlamaCppBench"
        peers.append(ProcessPeer("llama.cpp", factory, (gguf, n_ctx), args.peer_timeout))
        for n in (int(x) for x in args.lookup_tokens.split(",")):
            peers.append(ProcessPeer(f"llama.cpp lookup {n}", factory, (gguf, n_ctx, n), args.peer_timeout))
    rows = spec_decode.run(engines, prompts, cases, args.output_len, args.repeats, peers, progress=log)
    print(f"model {engines['off'].source.path.name}, {engines['off'].config.model.dtype}, {args.output_len} tokens out")
    print(table(rows))
    lines = spec_decode.ratios(rows)
    for line in lines:
        print(line)
    failed = report_failed_peers(peers)
    write_json(args, {"speculative_config": spec, "rows": rows, "verdicts": lines, **failed})
    if args.plot:
        from tacit.bench.plot import plot_grouped_bars

        name = engines["off"].source.path.name
        plot_grouped_bars(spec_decode.medians(rows), "decode tok/s", args.plot, f"speculative decoding, {name}")
        log(f"wrote {args.plot}")
    return 0
