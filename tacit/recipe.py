"""Recipes: one YAML file that picks the engine's settings for one model on one kind of hardware.

A recipe is the deployable half of a recipe folder (recipes/<name>/recipe.yaml; its README says
why each choice, with the measured numbers). Its sections name the seam they configure, and
their keys are LLMEngine's keyword arguments (with `model.path` for `model` and
`scheduler.policy` for `scheduling_policy`, the names a reader of the YAML looks for):

    name: smollm2-135m-cpu
    model: {dtype: bfloat16}
    scheduler: {policy: sla, slo_classes: {0: {ttft_ms: 500, tpot_ms: 400}}}

Whatever the caller passes explicitly (a `tacit serve` flag, an LLM(...) keyword) wins over the
recipe, and the recipe wins over the engine's defaults, as a vLLM `--config` file does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# section -> {YAML key: LLMEngine keyword}
SECTIONS: dict[str, dict[str, str]] = {
    "model": {"path": "model", "dtype": "dtype", "max_model_len": "max_model_len", "seed": "seed"},
    "platform": {"device": "device"},
    "cache": {k: k for k in ("block_size", "num_kv_blocks", "kv_cache_memory", "swap_space")},
    "scheduler": {"policy": "scheduling_policy",
                  **{k: k for k in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                                    "long_prefill_token_threshold", "max_long_partial_prefills", "aging_s",
                                    "slo_classes", "slo_admission", "preemption_mode", "cut_in_prefill_tokens")}},
}
INFO_KEYS = ("name", "description", "hardware")
RECIPE_FILE = "recipe.yaml"


@dataclass
class Recipe:
    path: Path
    name: str
    description: str
    engine_args: dict[str, Any]


def load_recipe(path: str | Path) -> Recipe:
    """Read and check a recipe file (or a folder holding recipe.yaml)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / RECIPE_FILE
    if not p.is_file():
        raise FileNotFoundError(f"recipe {str(path)!r} not found: give a recipe YAML file or a folder holding "
                                f"{RECIPE_FILE} (e.g. recipes/smollm2-135m-cpu)")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"recipe {p}: not valid YAML ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"recipe {p}: must be a mapping of sections ({', '.join(SECTIONS)}), "
                         f"got {type(doc).__name__}")
    args: dict[str, Any] = {}
    for section, body in doc.items():
        if section in INFO_KEYS:
            continue
        if section not in SECTIONS:
            raise ValueError(f"recipe {p}: unknown section {section!r}; valid: "
                             f"{', '.join([*SECTIONS, *INFO_KEYS])}")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ValueError(f"recipe {p}: section {section!r} must be a mapping of settings, got {body!r}")
        keys = SECTIONS[section]
        for key, value in body.items():
            if key not in keys:
                raise ValueError(f"recipe {p}: unknown key {section}.{key}; valid in {section!r}: {', '.join(keys)}")
            args[keys[key]] = value
    if isinstance(args.get("model"), str):
        # A relative model path means next to the recipe, so a recipe folder can ship its model.
        model = Path(args["model"]).expanduser()
        args["model"] = str(model if model.is_absolute() else (p.parent / model).resolve())
    _check(p, args)
    return Recipe(path=p, name=str(doc.get("name") or p.parent.name), description=str(doc.get("description") or ""),
                  engine_args=args)


def _check(path: Path, args: dict[str, Any]) -> None:
    """Fail on load, naming the file, rather than deep inside engine start-up."""
    from tacit.config import CacheConfig, SchedulerConfig, parse_dtype

    sched = {k: v for k, v in args.items() if k in SECTIONS["scheduler"].values()}
    if "scheduling_policy" in sched:
        sched["policy"] = sched.pop("scheduling_policy")
    cache = {k: v for k, v in args.items() if k in SECTIONS["cache"].values()}
    try:
        SchedulerConfig(**sched)
        CacheConfig(**cache)
        if args.get("dtype", "auto") != "auto":
            parse_dtype(args["dtype"])
        for key in ("max_model_len", "seed"):
            v = args.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{key}={v!r} is invalid: must be an integer >= 0")
        for key in ("model", "device"):
            if args.get(key) is not None and not isinstance(args[key], str):
                raise ValueError(f"{key}={args[key]!r} is invalid: must be a string")
    except (TypeError, ValueError) as e:
        raise ValueError(f"recipe {path}: {e}") from None


def merge_engine_args(recipe: str | Path | None, explicit: dict[str, Any]) -> dict[str, Any]:
    """Engine keyword arguments: the recipe's, overridden by the caller's explicit ones."""
    if recipe is None:
        return dict(explicit)
    return {**load_recipe(recipe).engine_args, **explicit}
