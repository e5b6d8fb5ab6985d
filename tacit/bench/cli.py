"""`tacit bench hw | latency`: print a table, optionally write JSON."""

from __future__ import annotations

import argparse
import json
import sys


def add_bench_parser(sub) -> None:
    from tacit.entrypoints.cli import add_engine_args

    b = sub.add_parser("bench", help="measure this machine and tacit (see docs/benchmarks.md)")
    bsub = b.add_subparsers(dest="bench", required=True)
    hw = bsub.add_parser("hw", help="memory bandwidth and matmul FLOP/s of this machine")
    hw.add_argument("--json", default=None)
    hw.set_defaults(func=cmd_hw)
    lat = bsub.add_parser("latency", help="TTFT and decode tok/s per batch size")
    add_engine_args(lat)
    lat.add_argument("--batch-sizes", default="1,4,16")
    lat.add_argument("--input-len", type=int, default=128)
    lat.add_argument("--output-len", type=int, default=64)
    lat.add_argument("--json", default=None)
    lat.set_defaults(func=cmd_latency)


def _table(rows: list[dict]) -> str:
    keys = list(rows[0])
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    widths = [max(len(k), *(len(fmt(r[k])) for r in rows)) for k in keys]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(fmt(r[k]).rjust(w) for k, w in zip(keys, widths)) for r in rows]
    return "\n".join(lines)


def cmd_hw(args: argparse.Namespace) -> int:
    from tacit.bench.hw import measure

    result = measure()
    print(_table([result]))
    if args.json:
        json.dump(result, open(args.json, "w"), indent=2)
    return 0


def cmd_latency(args: argparse.Namespace) -> int:
    from tacit.bench import latency
    from tacit.bench.hw import read_bandwidth
    from tacit.engine.llm_engine import LLMEngine
    from tacit.entrypoints.cli import engine_kwargs

    kwargs = engine_kwargs(args)
    if args.dtype == "auto":
        kwargs["dtype"] = "bfloat16"
    print("measuring read bandwidth ...", file=sys.stderr)
    bw = read_bandwidth() / 1e9
    engine = LLMEngine(**kwargs)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    rows = latency.run(engine, sizes, args.input_len, args.output_len, bw)
    print(f"model {engine.source.path.name}, {engine.config.model.dtype}, weights "
          f"{latency.weight_bytes(engine.model) / 1e6:.0f} MB, read bandwidth {bw:.1f} GB/s")
    print(_table(rows))
    if args.json:
        json.dump({"read_GBps": bw, "rows": rows}, open(args.json, "w"), indent=2)
    return 0
