"""Knobs: dataclass fields that say where each setting lives in a recipe and on the command line.

A dataclass of knob() fields (EngineArgs, config/engine_args.py) gets its keyword, recipe and
command-line views from Knobs: the keywords it takes (from_kwargs, over a recipe), its flags
(add_cli_args, one per field), the flags read back (from_cli_args) and its recipe sections.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, field, fields
from pathlib import Path
from typing import Any, Callable, TypeVar

from tacit.config.recipe import Recipe, read_recipe
from tacit.config.tunable import TuneSpec, check_tune_mark

# The recipe's sections in the order a recipe (and its error messages) lists them.
RECIPE_SECTIONS = ("model", "platform", "parallel", "cache", "scheduler")
# What each section holds, in words: the heading of its flags' argument group in `--help` (and
# `--help=SECTION`) and of its part of docs/reference/engine_args.md.
SECTION_TITLES = {
    "model": "Model and weights",
    "platform": "Platform",
    "parallel": "Parallelism",
    "cache": "KV cache",
    "scheduler": "Scheduler",
}

K = TypeVar("K", bound="Knobs")


def config_default(config: type, name: str) -> Any:
    """A config field's default. The configs own the engine's defaults, so they are written once."""
    f = config.__dataclass_fields__[name]
    return f.default_factory() if f.default is MISSING else f.default


def knob(
    default: Any,
    section: str,
    help: str,
    *,
    key: str | None = None,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    type: Callable[[str], Any] | None = None,
    shown: str | None = None,
    cli_help: str | None = None,
    from_cli: Callable[[Any], Any] | None = None,
    tune: TuneSpec | dict[str, TuneSpec] | None = None,
    **argparse_kwargs: Any,
) -> Any:
    """One engine knob: a dataclass field whose metadata says where it lives in a recipe and on the CLI.

    section/key: the recipe's `section: {key: ...}` (key defaults to the field's name).
    flag: the CLI flag (default --field-name); type and argparse_kwargs go to add_argument.
    aliases: other spellings of the same flag, the ones users bring from vLLM, SGLang or llama.cpp
    (--enable-expert-parallel for --expert-parallel): one field, one dest, several names.
    shown: how the help states the default when the value itself would not say it.
    cli_help: the flag's help, where the flag says something else than the keyword
    (--no-chunked-prefill turns enable_chunked_prefill off; --aging-s 0 means None).
    from_cli: turns the parsed flag into the field's value (e.g. --aging-s 0 into None).
    tune: the knob's range for `tacit tune` (config/tunable.py), where it changes performance (or,
    marked changes_output, results); a dict knob marks its keys: {key: TuneSpec}.
    """
    if section not in RECIPE_SECTIONS:
        raise ValueError(f"knob section {section!r} is not a recipe section; valid: {', '.join(RECIPE_SECTIONS)}")
    metadata = {
        "section": section,
        "key": key,
        "help": help,
        "flag": flag,
        "aliases": tuple(aliases),
        "type": type,
        "shown": shown,
        "cli_help": cli_help,
        "from_cli": from_cli,
        "tune": tune,
        "argparse": argparse_kwargs,
    }
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


class Knobs:
    """The keyword, recipe and command-line views of a dataclass whose fields are all knob()s.

    Precedence, as a vLLM `--config` file: what the caller says explicitly (a flag, a keyword)
    wins over the recipe, and the recipe wins over the defaults.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check every knob's tune= mark against its default as the class is defined (before
        @dataclass turns the Field objects into defaults), so a bad range fails naming its knob."""
        super().__init_subclass__(**kwargs)
        for name, f in vars(cls).items():
            if isinstance(f, Field) and "tune" in f.metadata:
                default = f.default_factory() if f.default is MISSING else f.default
                check_tune_mark(name, f.metadata["tune"], default)

    # ---- the keyword and command-line paths in ----------------------------------------------

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_kwargs(cls: type[K], recipe: str | None = None, **kwargs: Any) -> K:
        """The caller's keywords, over the recipe's settings (a YAML file or its folder), over the defaults.

        A keyword given as None still counts as given (aging_s=None means "no aging", not "unsaid").
        """
        valid = cls.names()
        unknown = [k for k in kwargs if k not in valid]
        if unknown:
            raise ValueError(
                f"unknown engine argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"valid: {', '.join(valid)}"
            )
        if recipe is None:
            return cls(**kwargs)
        return cls(**{**cls.load_recipe(recipe).engine_args, **kwargs})

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """--recipe and one flag per field, each recipe section's flags in an argument group titled
        with the section's name (what `--help=cache` shows). Every flag defaults to None, meaning
        "not given", so the recipe fills what the command line leaves out and the defaults fill the rest."""
        parser.add_argument(
            "--recipe",
            default=None,
            metavar="PATH",
            help="recipe YAML (or its folder, e.g. recipes/smollm2-135m-cpu); flags given here override it",
        )
        for section in RECIPE_SECTIONS:
            group = parser.add_argument_group(section, f"{SECTION_TITLES[section]} (the recipe's `{section}:`)")
            cls.add_section_cli_args(group, (section,))
        return parser

    @classmethod
    def add_section_cli_args(cls, parser: Any, sections: tuple[str, ...]) -> Any:
        """The flags of the fields in these recipe sections (a parser or an argument group), as
        add_cli_args adds them: `tacit predict --serve` takes the scheduler's this way."""
        for f in fields(cls):
            m = f.metadata
            if m["section"] not in sections:
                continue
            kwargs = dict(m["argparse"])
            if m["type"] is not None:
                kwargs["type"] = m["type"]
            parser.add_argument(_flag(f), *m["aliases"], dest=f.name, default=None, help=_help(f, cli=True), **kwargs)
        return parser

    @classmethod
    def from_cli_args(cls: type[K], args: argparse.Namespace) -> K:
        """The flags given (not None), over --recipe, over the defaults."""
        given = {}
        for f in fields(cls):
            value = getattr(args, f.name, None)
            if value is not None:
                convert = f.metadata["from_cli"]
                given[f.name] = convert(value) if convert else value
        return cls.from_kwargs(recipe=getattr(args, "recipe", None), **given)

    # ---- the recipe's view -------------------------------------------------------------------

    @classmethod
    def recipe_sections(cls) -> dict[str, dict[str, str]]:
        """{section: {YAML key: field name}}, in recipe order."""
        sections: dict[str, dict[str, str]] = {s: {} for s in RECIPE_SECTIONS}
        for f in fields(cls):
            sections[f.metadata["section"]][f.metadata["key"] or f.name] = f.name
        return sections

    @classmethod
    def load_recipe(cls, path: str | Path) -> Recipe:
        """Read and check a recipe file (or a folder holding recipe.yaml): its sections are this
        class's (each field's metadata names its section and key), and it must pass the class's own
        check() (every check that needs no model), so a bad setting fails on load, naming the file, not deep inside engine start-up."""
        return read_recipe(path, cls.recipe_sections(), lambda args: cls(**args).check())

    @classmethod
    def keyword_doc(cls, indent: str = "    ") -> str:
        """One line per keyword, for LLM's docstring."""
        return "\n".join(f"{indent}{f.name}: {_help(f)}" for f in fields(cls))


def _flag(f: Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _help(f: Field, cli: bool = False) -> str:
    """The help with its default: "most tokens in one step (default 2048)", "... (0: no cap; default 512)"."""
    text = (cli and f.metadata["cli_help"]) or f.metadata["help"]
    if cli and f.metadata["argparse"].get("action") == "store_const":
        return text  # a switch: its default is not using it
    if text.endswith(")"):
        return f"{text[:-1]}; default {_shown(f)})"
    return f"{text} (default {_shown(f)})"


def _shown(f: Field) -> str:
    if f.metadata["shown"] is not None:
        return f.metadata["shown"]
    value = f.default_factory() if f.default is MISSING else f.default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # "default 60", not "default 60.0"
    return str(value)
