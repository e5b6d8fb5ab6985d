"""EngineArgs: one field per knob makes the flags, the recipe keys and the keywords; flags beat the
recipe, which beats the defaults; the configs it builds are frozen and resolved once."""

import ast
import dataclasses
from pathlib import Path

import pytest

from tacit import LLM
from tacit.cli import build_parser
from tacit.config import (
    DEFAULT_CUT_IN_PREFILL_TOKENS,
    DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD,
    CacheConfig,
    EngineConfig,
    SchedulerConfig,
)
from tacit.config.engine_args import EngineArgs
from tacit.engine.llm_engine import LLMEngine
from tacit.loader import open_model
from tacit.platforms import get_platform

PACKAGE = Path(__file__).resolve().parents[2] / "tacit"
NAMES = [f.name for f in dataclasses.fields(EngineArgs)]

SECTIONS = EngineArgs.recipe_sections()


def _subparser(*command: str):
    parser = build_parser()
    for name in command:
        parser = parser._subparsers._group_actions[0].choices[name]
    return parser


@pytest.mark.parametrize(
    "command", [("generate",), ("chat",), ("serve",), ("bench", "latency"), ("bench", "throughput")]
)
def test_every_field_is_a_flag_of_every_engine_command(command):
    assert set(NAMES) | {"recipe"} <= {a.dest for a in _subparser(*command)._actions}


def test_every_field_has_a_recipe_key():
    assert list(SECTIONS) == ["model", "platform", "parallel", "cache", "scheduler"]
    keys = [name for section in SECTIONS.values() for name in section.values()]
    assert sorted(keys) == sorted(NAMES)
    assert SECTIONS["model"]["path"] == "model" and SECTIONS["scheduler"]["policy"] == "scheduling_policy"


def test_defaults_are_the_documented_numbers():
    a = EngineArgs()
    assert a.long_prefill_token_threshold == DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD == 512
    assert a.cut_in_prefill_tokens == DEFAULT_CUT_IN_PREFILL_TOKENS == 256
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.block_size, a.max_long_partial_prefills) == (64, 2048, 16, 1)
    assert (a.aging_s, a.swap_space, a.seed, a.slo_classes) == (60.0, 4.0, 0, {})
    assert (a.model, a.dtype, a.device, a.max_model_len, a.num_kv_blocks, a.kv_cache_memory) == (
        None,
        "auto",
        "auto",
        None,
        None,
        None,
    )
    assert (a.scheduling_policy, a.slo_admission, a.preemption_mode, a.enable_chunked_prefill) == (
        "fcfs",
        "reject",
        "auto",
        True,
    )
    # The configs' own defaults are real numbers too, not sentinels resolved later.
    s = SchedulerConfig()
    assert (s.long_prefill_token_threshold, s.cut_in_prefill_tokens) == (512, 256)
    # --help states them, from the same fields.
    helps = {a.dest: a.help for a in _subparser("serve")._actions}
    assert "default 512" in helps["long_prefill_token_threshold"] and "default 256" in helps["cut_in_prefill_tokens"]


def test_quantization_knobs_are_flags_and_keywords():
    args = build_parser().parse_args(["serve", "--quantization", "int4", "--quantization-group-size", "64"])
    a = EngineArgs.from_cli_args(args)
    assert (a.quantization, a.quantization_group_size) == ("int4", 64)
    assert (EngineArgs().quantization, EngineArgs().quantization_group_size) == ("auto", None)
    a = EngineArgs.from_kwargs(quantization="int8", quantization_group_size=128)
    assert (a.quantization, a.quantization_group_size) == ("int8", 128)
    helps = {a.dest: a.help for a in _subparser("generate")._actions}
    assert "int8 | int4" in helps["quantization"] and "32 | 64 | 128" in helps["quantization_group_size"]
    assert "int4 32, int8 one scale per output channel" in helps["quantization_group_size"]
    with pytest.raises(ValueError, match="quantization_group_size=48 is not supported; valid: 32, 64, 128"):
        EngineArgs(quantization="int4", quantization_group_size=48).check()


def _recipe(tmp_path: Path) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text("cache: {block_size: 8}\nscheduler: {policy: priority, max_num_seqs: 3, aging_s: 30}\n")
    return p


def test_flags_over_recipe_over_defaults(tmp_path):
    args = build_parser().parse_args(
        [
            "serve",
            "--recipe",
            str(_recipe(tmp_path)),
            "--max-num-seqs",
            "5",
            "--aging-s",
            "0",
            "--no-chunked-prefill",
            "--slo-class",
            "0:ttft=500,tpot=100",
        ]
    )
    a = EngineArgs.from_cli_args(args)
    assert a.max_num_seqs == 5  # the flag over the recipe's 3
    assert a.aging_s is None  # --aging-s 0: no aging
    assert a.scheduling_policy == "priority" and a.block_size == 8  # the recipe over the defaults
    assert a.long_prefill_token_threshold == 512 and a.max_num_batched_tokens == 2048  # the defaults
    assert a.enable_chunked_prefill is False and a.slo_classes == {0: {"ttft_ms": 500.0, "tpot_ms": 100.0}}
    # Flags not given leave the recipe alone.
    a = EngineArgs.from_cli_args(build_parser().parse_args(["serve", "--recipe", str(_recipe(tmp_path))]))
    assert (a.max_num_seqs, a.aging_s, a.enable_chunked_prefill) == (3, 30, True)


def test_keywords_over_recipe_and_explicit_none_counts(tmp_path):
    a = EngineArgs.from_kwargs(recipe=str(_recipe(tmp_path)), max_num_seqs=7, aging_s=None)
    assert (a.max_num_seqs, a.aging_s, a.block_size) == (7, None, 8)


def test_unknown_keyword_is_refused_naming_it_and_the_valid_ones():
    with pytest.raises(ValueError, match="unknown engine argument max_num_seq; valid: model, dtype, ") as err:
        LLM(max_num_seq=3)
    assert "cut_in_prefill_tokens" in str(err.value)
    with pytest.raises(ValueError, match="unknown engine arguments blocksize, polcy"):
        LLMEngine(blocksize=8, polcy="sla")


def _config(tiny_llama, **kwargs) -> EngineConfig:
    return EngineArgs(model=str(tiny_llama[2]), dtype="float32", **kwargs).create_engine_config(
        open_model(str(tiny_llama[2])), get_platform("cpu")
    )


def test_configs_are_frozen(tiny_llama):
    cfg = _config(tiny_llama)
    for obj, name, value in [
        (cfg, "seed", 1),
        (cfg.model, "max_model_len", 8),
        (cfg.cache, "block_size", 32),
        (cfg.scheduler, "max_num_batched_tokens", 1),
        (EngineArgs(), "max_num_seqs", 1),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, value)


def test_budget_is_raised_to_max_model_len_without_chunked_prefill_once(tiny_llama):
    cfg = _config(tiny_llama, enable_chunked_prefill=False, max_num_batched_tokens=64, max_model_len=256)
    assert cfg.scheduler.max_num_batched_tokens == 256 and cfg.model.max_model_len == 256
    cfg = _config(tiny_llama, enable_chunked_prefill=False, max_num_batched_tokens=64)  # the model's 1024
    assert cfg.scheduler.max_num_batched_tokens == 1024
    assert _config(tiny_llama, max_num_batched_tokens=64).scheduler.max_num_batched_tokens == 64  # chunked: as said
    # EngineConfig only checks: it refuses the inconsistent pair rather than rewriting the scheduler's field.
    with pytest.raises(ValueError, match="enable_chunked_prefill=False needs max_num_batched_tokens >= max_model_len"):
        EngineConfig(
            model=cfg.model,
            cache=CacheConfig(),
            scheduler=SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=64),
        )


def test_engine_takes_keywords_or_engine_args(tiny_llama):
    path = str(tiny_llama[2])
    e = LLMEngine(path, dtype="float32", max_num_seqs=3, num_kv_blocks=16)
    assert e.config.scheduler.max_num_seqs == 3 and e.engine_args.num_kv_blocks == 16
    e = LLMEngine(engine_args=EngineArgs(model=path, dtype="float32", num_kv_blocks=16, scheduling_policy="sjf"))
    assert e.scheduler.policy.name == "sjf"
    with pytest.raises(ValueError, match="either engine_args or keyword arguments"):
        LLMEngine(engine_args=EngineArgs(), max_num_seqs=3)


def _imports(folder: str) -> set[str]:
    found = set()
    for path in (PACKAGE / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


def test_entrypoints_and_bench_do_not_import_each_other():
    assert not {m for m in _imports("bench") if m.startswith("tacit.entrypoints")}
    assert not {m for m in _imports("entrypoints") if m.startswith("tacit.bench")}
