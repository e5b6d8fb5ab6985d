"""`tacit ...`: the command line. It sits above both halves of the package: the entrypoints'
commands (generate, chat, serve, fetch), the benchmarks' (bench), the evaluations' (eval), the profiler's
(profile) and the performance model's (predict), which share only the engine flags
(EngineArgs.add_cli_args) and never import each other.

The subcommands are imported by build_parser, not at the top: main() asks for 2 MB pages first,
before torch's first allocation (platforms/huge_pages.py)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from tacit.bench.cli import add_bench_parser
    from tacit.entrypoints.cli import add_parsers
    from tacit.eval.kld import add_eval_parser
    from tacit.perf_model.cli import add_predict_parser
    from tacit.profiler.cli import add_profile_parser

    parser = argparse.ArgumentParser(prog="tacit", description="tacit: an LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parsers(sub)
    add_bench_parser(sub)
    add_eval_parser(sub)
    add_profile_parser(sub)
    add_predict_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Before build_parser imports the engine, whose modules allocate tensors as they load (the
    # platforms package imports torch, which alone allocates nothing).
    from tacit.platforms.huge_pages import request_transparent_huge_pages

    request_transparent_huge_pages()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"tacit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
