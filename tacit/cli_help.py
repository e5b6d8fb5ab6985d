"""`--help=GROUP | listgroup | KEYWORD`, as vLLM's: a subcommand with a hundred flags shows one
argument group, lists its groups, or the flags a keyword finds, instead of the whole page.

Every subcommand parser of `tacit` is a HelpfulParser (tacit/cli.py passes it as the subparsers'
parser_class, and nested subparsers inherit it). The engine commands group their flags by recipe
section (model, platform, parallel, cache, scheduler: config/knobs.py), `tacit serve` adds frontend.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

LIST_GROUPS = "listgroup"


def _group_key(title: str) -> str:
    """A group title as --help= matches it: case-insensitive, and vLLM's config-class spelling
    names the same group (ModelConfig, CacheConfig, ParallelConfig, SchedulerConfig)."""
    key = title.lower().replace("_", " ").replace("-", " ").strip()
    return key[: -len("config")].strip() if key.endswith("config") and key != "config" else key


class FilteredHelpAction(argparse.Action):
    """-h/--help with an optional value: nothing prints the whole help, as argparse's does."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **_: Any) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs="?",
            metavar="GROUP|listgroup|KEYWORD",
            help="show this help and exit; =GROUP: only that argument group (listgroup names them), "
            "=KEYWORD: the flags whose name or help contains it",
        )

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: str | None = None):
        if not values:  # --help, or --help= with nothing after it
            parser.print_help()
        else:
            print(filtered_help(parser, values), end="")
        parser.exit()


def filtered_help(parser: argparse.ArgumentParser, what: str) -> str:
    """The help --help=WHAT prints; an unknown group or keyword exits 2 with a message listing the groups."""
    groups = [g for g in parser._action_groups if g._group_actions]
    wanted = what.strip()
    if wanted.lower() == LIST_GROUPS:
        width = max(len(g.title or "") for g in groups)
        lines = [f"  {g.title:<{width}}  {g.description or ''}".rstrip() for g in groups]
        return f"argument groups of `{parser.prog}` (--help=GROUP shows one):\n" + "\n".join(lines) + "\n"
    for g in groups:
        if _group_key(g.title or "") == _group_key(wanted):
            return _format(parser, [(g.title, g.description, g._group_actions)])
    subcommand = _subcommand(parser, wanted)  # `tacit bench --help latency`
    if subcommand is not None:
        return subcommand.format_help()
    needle = wanted.lower()
    found = [(g.title, None, hits) for g in groups if (hits := [a for a in g._group_actions if _mentions(a, needle)])]
    if not found:
        titles = ", ".join(g.title or "" for g in groups)
        # exit, not parser.error: the usage it prints first is 40 lines of serve's flags.
        parser.exit(
            2,
            f"{parser.prog}: error: --help={what}: no argument group, and no flag whose name or help contains it; "
            f"the groups: {titles} (--help={LIST_GROUPS} describes them)\n",
        )
    return _format(parser, found)


def _mentions(action: argparse.Action, needle: str) -> bool:
    if action.help == argparse.SUPPRESS:
        return False
    names = " ".join(action.option_strings) or action.dest
    return needle in names.lower() or needle in (action.help or "").lower()


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction) and name in a.choices:
            return a.choices[name]
    return None


def _format(parser: argparse.ArgumentParser, sections: list[tuple[str | None, str | None, list]]) -> str:
    formatter = parser._get_formatter()  # no usage line: serve's alone is 40 lines of flags
    for title, description, actions in sections:
        formatter.start_section(title)
        formatter.add_text(description)
        formatter.add_arguments(actions)
        formatter.end_section()
    return formatter.format_help()


class HelpfulParser(argparse.ArgumentParser):
    """An ArgumentParser whose -h/--help takes =GROUP, =listgroup or =KEYWORD (FilteredHelpAction)."""

    def __init__(self, *args: Any, add_help: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, add_help=False, **kwargs)
        if add_help:
            self.add_argument("-h", "--help", action=FilteredHelpAction)
