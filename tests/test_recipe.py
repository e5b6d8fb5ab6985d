"""Recipes: the shipped ones load, their settings reach the engine, explicit arguments win, and a
broken recipe is refused naming the file and what would be valid."""

import subprocess
import sys
from pathlib import Path

import pytest

from tacit import LLM
from tacit.config.engine_args import load_recipe

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "recipes").glob("*/recipe.yaml"))


def test_recipes_ship_and_load():
    assert SHIPPED, "recipes/ holds no recipe.yaml"
    for path in SHIPPED:
        recipe = load_recipe(path.parent)
        assert recipe.name == path.parent.name
        assert (path.parent / "README.md").is_file(), f"{path.parent} has no README saying why"


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(text)
    return p


def test_recipe_settings_reach_the_engine_and_explicit_arguments_win(tiny_llama, tmp_path):
    recipe = _write(
        tmp_path,
        f"""
model: {{path: {tiny_llama[2]}, dtype: float32}}
cache: {{block_size: 8}}
scheduler:
  policy: priority
  max_num_seqs: 3
  aging_s: null
  slo_classes: {{0: {{ttft_ms: 250}}}}
""",
    )
    e = LLM(recipe=str(recipe)).engine
    assert e.scheduler.policy.name == "priority" and e.config.scheduler.max_num_seqs == 3
    assert e.config.cache.block_size == 8 and e.config.scheduler.aging_s is None
    assert e.config.scheduler.slo_classes == {0: {"ttft_ms": 250}}
    assert str(e.config.model.dtype) == "torch.float32"
    e = LLM(recipe=str(recipe.parent), scheduling_policy="sjf", max_num_seqs=5).engine
    assert e.scheduler.policy.name == "sjf" and e.config.scheduler.max_num_seqs == 5
    assert e.config.cache.block_size == 8  # what the caller did not say still comes from the recipe


def test_relative_model_path_is_next_to_the_recipe(tiny_llama, tmp_path):
    model = Path(tiny_llama[2])
    recipe = _write(model.parent, f"model: {{path: {model.name}}}\n")
    try:
        assert load_recipe(recipe).engine_args["model"] == str(model.resolve())
    finally:
        recipe.unlink()


@pytest.mark.parametrize(
    "text, match",
    [
        ("- just\n- a list\n", "must be a mapping of sections"),
        ("model: {dtype: [unclosed\n", "not valid YAML"),
        ("engine: {dtype: bfloat16}\n", "unknown section 'engine'; valid: model, platform, parallel, cache, scheduler"),
        ("scheduler: {polcy: sla}\n", "unknown key scheduler.polcy; valid in 'scheduler': policy, max_num_seqs"),
        ("scheduler: {policy: lifo}\n", "scheduling_policy='lifo' is not known; valid: fcfs, priority, sjf, sla"),
        ("scheduler: {max_num_seqs: 0}\n", "max_num_seqs=0 is invalid: must be an integer >= 1"),
        ("scheduler: {enable_chunked_prefill: sometimes}\n", "enable_chunked_prefill='sometimes' is invalid"),
        (
            "scheduler: {slo_classes: {0: {ttft: 5}}}\n",
            "slo_classes[0] key 'ttft' is not known; valid: ttft_ms, tpot_ms",
        ),
        ("cache: {block_size: -4}\n", "block_size=-4 is invalid"),
        ("cache: 16\n", "section 'cache' must be a mapping"),
        ("model: {dtype: int3}\n", "dtype='int3' is not supported"),
        ("model: {max_model_len: lots}\n", "max_model_len='lots' is invalid"),
    ],
)
def test_broken_recipe_is_refused_naming_file_and_fix(tmp_path, text, match):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match="recipe .*recipe.yaml: ") as err:
        load_recipe(path)
    assert match in str(err.value)


def test_missing_recipe_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="recipe .*nope.* not found: give a recipe YAML file or a folder"):
        load_recipe(tmp_path / "nope")


def test_cli_refuses_a_broken_recipe_before_loading(tmp_path):
    path = _write(tmp_path, "scheduler: {policy: lifo}\n")
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "serve", "--recipe", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "scheduling_policy='lifo' is not known" in r.stderr and str(path) in r.stderr
