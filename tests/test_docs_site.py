"""The documentation site (mkdocs.yml, docs/): it builds strictly, every page is in the nav, the
generated engine-arguments page matches EngineArgs, and the tacit command lines it shows parse."""

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _printed(fn, *args) -> str:
    """What fn(*args) prints to stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue()


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, {"not in nav": sorted(set(pages) - set(nav)), "missing": sorted(set(nav) - set(pages))}


def test_the_engine_arguments_page_is_what_the_script_writes():
    gen = load_script("gen_cli_reference")
    page = gen.render()
    assert (DOCS / "reference" / "engine_args.md").read_text() == page, (
        "docs/reference/engine_args.md is stale: run python scripts/gen_cli_reference.py"
    )
    from tacit.config.engine_args import EngineArgs

    for name in EngineArgs.names():  # every knob is on the page, by keyword
        assert f"Keyword `{name}`" in page, name


def _command_lines(text: str) -> list[str]:
    """The `tacit ...` lines of a page's bash blocks, comments and a leading `echo ... |` cut off;
    lines with [optional] parts or placeholders in capitals are left out (they are usage, not commands)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" | ")[-1].split("  #")[0].strip()
            if line.startswith(".venv/bin/tacit "):
                line = line.removeprefix(".venv/bin/")
            if line.startswith("tacit ") and "[" not in line and not re.search(r"\b[A-Z]{2,}\b(?!\.)", line):
                lines.append(line)
    return lines


def test_the_command_lines_in_the_readme_and_the_docs_parse():
    from tacit.cli import build_parser

    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    lines = {(p.name, line) for p in pages for line in _command_lines(p.read_text())}
    assert len(lines) >= 10, lines  # the README alone shows chat, generate, serve and bench
    bad = []
    for page, line in sorted(lines):
        try:
            build_parser().parse_args(shlex.split(line)[1:])
        except SystemExit:
            bad.append(f"{page}: {line}")
    assert not bad, bad


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs-material is not installed (pip install -e '.[dev]' installs it)",
)
def test_the_site_builds_strictly(tmp_path):
    # --strict: a broken link or anchor, or a page left out of the nav, is an error (mkdocs.yml's validation).
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,  # mkdocs.yml's snippets (the recipe pages) are read relative to the repository root
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material's banner about its successor
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "engine_args" / "index.html").is_file()


# The subcommands whose docs lines run here: each loads the default model at most once and ends by
# itself. serve runs until stopped and bench for minutes (their lines are parsed above, and
# their behaviour has tests of its own); fetch installs a wheel.
RUNNABLE = ("models", "generate", "chat")


def test_the_short_command_lines_in_the_readme_and_the_docs_run():
    """The README's and the docs' `tacit models / generate / chat` lines, run as written (a chat
    line gets one user turn on stdin, as when piped); placeholder paths (path/to/...) are left out."""
    from tacit.loader.default_model import default_model_path

    if not default_model_path().exists():
        pytest.skip("the default model is not fetched (scripts/setup.sh fetches it)")
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    lines = sorted({line for p in pages for line in _command_lines(p.read_text())})
    runnable = [line for line in lines if shlex.split(line)[1] in RUNNABLE and "path/to" not in line]
    assert any(" chat" in line for line in runnable) and any(" generate" in line for line in runnable), runnable
    failed = []
    for line in runnable:
        argv = shlex.split(line)
        if argv[1] == "chat":
            argv += ["--max-tokens", "8"]  # one short answer is enough to know the line works
        out = subprocess.run(
            [sys.executable, "-m", "tacit.cli", *argv[1:]],
            input="Hello!\n",
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        if out.returncode != 0 or not out.stdout.strip():
            failed.append(f"{line}: exit {out.returncode}\n{out.stderr[-600:]}")
    assert not failed, "\n".join(failed)


def test_the_recipe_notes_are_what_the_script_writes():
    """Every figure in recipes/configs/<Model>/README.md is the output of the `tacit predict`
    command printed above it: a change to the model that moves one leaves the note stale (the
    gpt-oss notes still read 46.50 GB a device from before MXFP4 was priced, at 17.63)."""
    gen = load_script("recipe_notes")
    from tacit.perf_model.model_shape import recipe_config_names

    stale = [
        n for n in recipe_config_names() if (ROOT / "recipes" / "configs" / n / "README.md").read_text() != gen.note(n)
    ]
    assert not stale, f"stale recipe notes {stale}: run PYTHONPATH=. python scripts/recipe_notes.py"


# Printed blocks a test can rerun: `$ tacit predict ... [| grep [-E] 'PAT'] [| head -N]` on a named
# part of the table. Left out: this-cpu (it fits this machine first), a path under the home
# directory (the printed header names it), and the commands that measure or write files.
_NOT_RERUN = ("this-cpu", "--validate", "--serve", "--calibrate", "--published", "--json", "--plot", "~", "$")


def _rerun(command: str) -> list[str] | None:
    """What `command` prints now, its pipes applied; None where it is not a block of that shape."""
    from tacit.cli import main

    first, *pipes = [p.strip() for p in command.split(" | ")]
    if not first.startswith("tacit predict ") or "--hardware" not in first or any(x in first for x in _NOT_RERUN):
        return None
    lines = _printed(main, shlex.split(first)[1:]).splitlines()
    for pipe in pipes:
        words = shlex.split(pipe)
        # grep -E's patterns read as Python's; a basic one only where it has no character that
        # the two dialects read differently
        basic = words[0] == "grep" and len(words) == 2 and not set(words[1]) & set("|()+?{}")
        if basic or (words[0] == "grep" and words[1:-1] == ["-E"]):
            lines = [ln for ln in lines if re.search(words[-1], ln)]
        elif words[0] == "head" and len(words) == 2 and words[1][1:].isdigit():
            lines = lines[: int(words[1][1:])]
        else:
            return None
    return lines


@pytest.mark.parametrize("page", ["docs/worked-answers.md", "recipes/qwen3-moe-larger-than-memory/README.md"])
def test_printed_predictions_are_what_the_command_prints(page):
    """A `$ tacit predict` line in a code block is followed by its output: rerun, it prints the
    same (the worked answers' MTP blocks and the Qwen3-MoE recipe's had drifted from the model)."""
    lines = (ROOT / page).read_text().splitlines()
    checked, stale = 0, []
    for i, line in enumerate(lines):
        if not line.startswith("$ tacit predict"):
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(("$ ", "```"))), len(lines))
        now = _rerun(line[2:])
        if now is not None:
            checked += 1
            if now != lines[i + 1 : end]:
                stale.append(f"line {i + 1}")
    assert checked, f"{page} has no block this test reruns"
    assert not stale, f"{page}: printed output differs from the command's at {stale}"


@pytest.mark.parametrize("table", ["ridge", "mla", "quant", "mtp"])
def test_the_worked_answers_tables_are_what_the_script_prints(table):
    """docs/worked-answers.md pastes `python scripts/worked_tables.py TABLE` whole: rerun, it
    prints the same (the MTP table had moved with the step model's merge fix)."""
    printed = _printed(getattr(load_script("worked_tables"), table))
    page = (DOCS / "worked-answers.md").read_text()
    assert f"$ PYTHONPATH=. python scripts/worked_tables.py {table}\n{printed}" in page, (
        f"docs/worked-answers.md's {table} table is stale: rerun PYTHONPATH=. python scripts/worked_tables.py {table}"
    )
