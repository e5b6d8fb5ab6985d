"""`tacit ...`: the command line. It sits above both halves of the package: the entrypoints'
commands (generate, chat, serve, fetch), the benchmarks' (bench), the evaluations' (eval), the profiler's
(profile) and the performance model's (predict), which share only the engine flags
(EngineArgs.add_cli_args) and never import each other.

The subcommands are imported by build_parser, not at the top: main() asks for 2 MB pages first,
before torch's first allocation (platforms/huge_pages.py)."""

from __future__ import annotations

import argparse
import difflib
import sys

from tacit import __version__
from tacit.cli_help import HelpfulParser


def build_parser() -> argparse.ArgumentParser:
    from tacit.bench.cli import add_bench_parser
    from tacit.entrypoints.cli import add_parsers
    from tacit.eval.kld import add_eval_parser
    from tacit.perf_model.cli import add_predict_parser
    from tacit.profiler.cli import add_profile_parser
    from tacit.tune.cli import add_tune_parser

    parser = argparse.ArgumentParser(prog="tacit", description="tacit: an LLM inference engine")
    parser.add_argument("--version", action="version", version=f"tacit {__version__}")
    # HelpfulParser: every subcommand's --help takes =GROUP, =listgroup or =KEYWORD, as vLLM's.
    sub = parser.add_subparsers(dest="command", required=True, parser_class=HelpfulParser)
    add_parsers(sub)
    add_bench_parser(sub)
    add_eval_parser(sub)
    add_profile_parser(sub)
    add_predict_parser(sub)
    add_tune_parser(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """parser.parse_args, except that an unknown flag is answered by the subcommand it was given to
    (argparse answers with `tacit`'s own usage, which lists no flag of `tacit serve`): its usage,
    and the closest of its flags (difflib), so `--kv-cache-memroy` points at --kv-cache-memory."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = _innermost_parser(parser, argv)
        known = list(command._option_string_actions)
        notes = [f"unrecognized arguments: {' '.join(unknown)}"]
        for flag in (t.split("=", 1)[0] for t in unknown if t.startswith("-")):
            close = difflib.get_close_matches(flag, known, n=3)
            notes.append(
                f"{flag}: did you mean {' or '.join(close)}?" if close else f"{flag}: see `{command.prog} --help`"
            )
        command.error("; ".join(notes))  # prints the subcommand's usage and exits 2
    return args


def _innermost_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser the command line names: `tacit bench latency ...` -> bench latency's."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = next((i for i, t in enumerate(argv) if subs and t in subs[0].choices), None)
        if chosen is None:
            return parser
        parser, argv = subs[0].choices[argv[chosen]], argv[chosen + 1 :]


def main(argv: list[str] | None = None) -> int:
    # Before build_parser imports the engine, whose modules allocate tensors as they load (the
    # platforms package imports torch, which alone allocates nothing).
    from tacit.platforms.huge_pages import request_transparent_huge_pages

    request_transparent_huge_pages()
    args = parse_args(build_parser(), argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # for outputs that say how they were made
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"tacit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
