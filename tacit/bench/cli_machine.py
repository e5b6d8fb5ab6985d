"""`tacit bench hw | attention | comm`: this machine and single kernels measured without an
engine: memory bandwidth and matmul FLOP/s, decode attention per KV cache dtype, and the
shared-memory communicator against gloo."""

from __future__ import annotations

import argparse
import json

from tacit.bench.cli_output import log, table, write_json


def add_machine_parsers(bsub: argparse._SubParsersAction) -> None:
    hw = bsub.add_parser("hw", help="memory bandwidth and matmul FLOP/s of this machine")
    hw.add_argument("--json", default=None)
    hw.set_defaults(func=cmd_hw)
    at = bsub.add_parser("attention", help="decode attention alone, per KV cache dtype (C++ kernels)")
    at.add_argument("--model", default=None, help="whose attention shape (default: the embedded model)")
    at.add_argument("--context", type=int, default=4096, help="tokens of context per row")
    at.add_argument("--batch-sizes", default="1,8")
    at.add_argument("--kv-cache-dtypes", default="bfloat16,int8", help="compared in turn; speedup is against the first")
    at.add_argument("--repeats", type=int, default=5)
    at.add_argument(
        "--sliding-window",
        action="store_true",
        help="a sliding-window layer against a full one of the model's shape (torch backend), and KV bytes a request",
    )
    at.add_argument(
        "--dsa",
        action="store_true",
        help="a DeepSeek-V3.2 model: one layer's DSA (indexer + sparse MLA) against dense absorbed MLA, batch 1, bf16",
    )
    at.add_argument("--json", default=None)
    at.set_defaults(func=cmd_attention)
    cm = bsub.add_parser("comm", help="the shared-memory communicator against gloo on local ranks")
    cm.add_argument("--world-size", type=int, default=2)
    cm.add_argument("--sizes", default="4KB,16KB,64KB,256KB,1MB,4MB,16MB,32MB", help="bytes per rank's tensor")
    cm.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    cm.add_argument(
        "--collectives", default="all_reduce", help="comma list of all_reduce, all_gather, all_to_all, reduce_scatter"
    )
    cm.add_argument("--repeats", type=int, default=5, help="timed repeats per cell (the median is reported)")
    cm.add_argument("--json", default=None)
    cm.add_argument(
        "--plot", default=None, help="PNG: time against message size, one line per communicator and collective"
    )
    cm.set_defaults(func=cmd_comm)


def cmd_hw(args: argparse.Namespace) -> int:
    from tacit.platforms.hw_probe import measure

    result = measure()
    print(table([result]))
    if args.json:
        json.dump(result, open(args.json, "w"), indent=2)
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    from tacit.bench.attention import measure_attention
    from tacit.bench.random_model import resolve_bench_model
    from tacit.loader import open_model

    hf = open_model(resolve_bench_model(args.model)).hf_config
    if args.dsa:
        from tacit.bench.dsa_attention import measure_dsa_attention

        rows = measure_dsa_attention(hf, args.context, args.repeats)
    elif args.sliding_window:
        from tacit.bench.window_attention import measure_sliding_window

        rows = measure_sliding_window(hf, args.context, args.repeats)
    else:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
        rows = measure_attention(hf, args.context, batch_sizes, args.kv_cache_dtypes.split(","), args.repeats)
    print(table(rows))
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=2)
    return 0


def cmd_comm(args: argparse.Namespace) -> int:
    from tacit.bench import comm
    from tacit.bench.plot import require_plotting

    require_plotting(args.plot)
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in collectives if c not in comm.COLLECTIVES]
    if bad or not collectives:
        raise ValueError(f"--collectives {args.collectives!r}: valid: {', '.join(comm.COLLECTIVES)}")
    sizes = [comm.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    log(f"{args.world_size} ranks, {args.dtype}, {len(sizes)} sizes, {args.repeats} repeats ...")
    rows = comm.run(args.world_size, sizes, args.dtype, collectives, args.repeats)
    print(f"{args.world_size} ranks, {args.dtype}; time per call (slowest rank, median of {args.repeats})")
    print(table([{k: v for k, v in r.items() if k != "bytes"} for r in rows]))
    lines = comm.verdicts(rows)
    for line in lines:
        print(line)
    write_json(
        args,
        {"world_size": args.world_size, "dtype": args.dtype, "repeats": args.repeats, "rows": rows, "verdicts": lines},
    )
    if args.plot:
        plot_comm(rows, f"{args.world_size} ranks, {args.dtype}", args.plot)
        log(f"wrote {args.plot}")
    return 0


def plot_comm(rows: list[dict], title: str, path: str) -> None:
    """comm.run's rows drawn log-log: time per call against bytes per rank, one line per
    communicator and collective (the default sizes span 4KB to 32MB, 8192x, and the times grow
    with them: on linear axes every size under 1MB would sit on the floor)."""
    from tacit.bench.plot import plot_lines

    series = [
        {"engine": f"{name} {r['collective']}", "message_bytes": r["bytes"], "time_us": r[f"{name}_us"]}
        for name in ("shm", "gloo")
        for r in rows
    ]
    ticks = {r["bytes"]: r["size"] for r in rows}
    plot_lines(series, "message_bytes", "time_us", path, f"collective time per call, {title}", log=True, xticks=ticks)
