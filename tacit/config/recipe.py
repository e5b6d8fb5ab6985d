"""Recipes: one YAML file that picks the engine's settings for one model on one kind of hardware.

A recipe is the deployable half of a recipe folder (recipes/<name>/recipe.yaml; its README says
why each choice, with the measured numbers). Its sections name the seam they configure, and
their keys are EngineArgs' fields (with `model.path` for `model` and `scheduler.policy` for
`scheduling_policy`, the names a reader of the YAML looks for); each field's metadata says its
section and key (tacit/config/engine_args.py, config/knobs.py):

    name: smollm2-135m-cpu
    model: {dtype: bfloat16}
    scheduler: {policy: sla, slo_classes: {0: {ttft_ms: 500, tpot_ms: 400}}}

Whatever the caller passes explicitly (a `tacit serve` flag, an LLM(...) keyword) wins over the
recipe, and the recipe wins over the engine's defaults, as a vLLM `--config` file does
(EngineArgs.from_kwargs). This module only reads the YAML; the sections and the check come from
EngineArgs (config/knobs.py: Knobs.load_recipe), which sits above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

INFO_KEYS = ("name", "description", "hardware")
RECIPE_FILE = "recipe.yaml"


@dataclass
class Recipe:
    path: Path
    name: str
    description: str
    engine_args: dict[str, Any]


def read_recipe(
    path: str | Path, sections: dict[str, dict[str, str]], check: Callable[[dict[str, Any]], None]
) -> Recipe:
    """Read a recipe file (or a folder holding recipe.yaml): sections is {section: {YAML key:
    EngineArgs field}}; check(settings) raises TypeError / ValueError for settings the engine
    refuses, reported here naming the file."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / RECIPE_FILE
    if not p.is_file():
        raise FileNotFoundError(
            f"recipe {str(path)!r} not found: give a recipe YAML file or a folder holding "
            f"{RECIPE_FILE} (e.g. recipes/smollm2-135m-cpu)"
        )
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"recipe {p}: not valid YAML ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"recipe {p}: must be a mapping of sections ({', '.join(sections)}), got {type(doc).__name__}")
    args: dict[str, Any] = {}
    for section, body in doc.items():
        if section in INFO_KEYS:
            continue
        if section not in sections:
            raise ValueError(f"recipe {p}: unknown section {section!r}; valid: {', '.join([*sections, *INFO_KEYS])}")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ValueError(f"recipe {p}: section {section!r} must be a mapping of settings, got {body!r}")
        keys = sections[section]
        for key, value in body.items():
            if key not in keys:
                raise ValueError(f"recipe {p}: unknown key {section}.{key}; valid in {section!r}: {', '.join(keys)}")
            args[keys[key]] = value
    if isinstance(args.get("model"), str):
        # A relative model path means next to the recipe, so a recipe folder can ship its model;
        # one that is not there is kept as written, for the loader to resolve (a Hugging Face repo
        # id such as Qwen/Qwen3-0.6B, or its missing-path error).
        model = Path(args["model"]).expanduser()
        beside = p.parent / model
        if model.is_absolute() or beside.exists():
            args["model"] = str(model if model.is_absolute() else beside.resolve())
    try:
        check(args)
    except (TypeError, ValueError) as e:
        raise ValueError(f"recipe {p}: {e}") from None
    return Recipe(
        path=p,
        name=str(doc.get("name") or p.parent.name),
        description=str(doc.get("description") or ""),
        engine_args=args,
    )
