"""tacit tune's search space: read from EngineArgs' knob marks, every drawn point valid."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import numpy as np
import optuna
import pytest

from tacit.config.engine_args import EngineArgs
from tacit.config.knobs import Knobs, knob
from tacit.config.tunable import TuneSpec
from tacit.tune import Dimension, sample, search_space, suggest, validate_point

# What a vLLM/SGLang user would search (issue 38), written out here so a mark that goes missing
# from engine_args.py, or one that appears unreviewed, fails this test.
PERFORMANCE_KNOBS = [
    "threads",
    "tensor_parallel_size",
    "expert_parallel",
    "two_batch_overlap",
    "data_parallel_attention",
    "block_size",
    "scheduling_policy",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "max_long_partial_prefills",
    "aging_s",
    "preemption_mode",
    "cut_in_prefill_tokens",
    "enable_cache_aware_scheduling",
]
OUTPUT_KNOBS = ["quantization", "kv_cache_dtype"]
SPEC_KEYS = ["speculative_config.num_speculative_tokens", "speculative_config.min_speculative_tokens"]
SPEC_BASE = EngineArgs(
    speculative_config={"method": "ngram", "num_speculative_tokens": 4},
    slo_classes={0: {"ttft_ms": 500.0}},
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _marked() -> list[str]:
    return [f.name for f in fields(EngineArgs) if f.metadata["tune"] is not None]


def test_the_space_is_exactly_the_marked_knobs():
    assert sorted(_marked()) == sorted(PERFORMANCE_KNOBS + OUTPUT_KNOBS + ["speculative_config"])
    space = search_space()
    assert [d.name for d in space] == [n for n in _marked() if n in PERFORMANCE_KNOBS]
    for d in space:  # the default is the base's value, here EngineArgs()'s
        assert d.default == getattr(EngineArgs(), d.name), d.name
    # Output-changing knobs only with an accuracy budget; the draft bounds only with a method.
    allowed = {d.name for d in search_space(allow_output_changes=True, base=SPEC_BASE)}
    assert allowed == set(PERFORMANCE_KNOBS + OUTPUT_KNOBS + SPEC_KEYS)
    assert not {d.name for d in search_space(base=SPEC_BASE)} & set(OUTPUT_KNOBS)
    with pytest.raises(ValueError, match="kv_cache_dtype was asked for, but it changes outputs"):
        search_space(include={"kv_cache_dtype"})
    with pytest.raises(ValueError, match="speculative_config, which the base configuration does not set"):
        search_space(include={"speculative_config.num_speculative_tokens"})


def test_stages_and_base_narrow_the_space():
    model = {d.name for d in search_space(stage="model")}
    measured = {d.name for d in search_space(stage="measured")}
    assert "threads" not in model and "threads" in measured
    layout = {"tensor_parallel_size", "expert_parallel", "two_batch_overlap", "data_parallel_attention"}
    assert layout <= model and not layout & measured
    with pytest.raises(ValueError, match="stage='fast' is not known; valid: both, model, measured"):
        search_space(stage="fast")
    with pytest.raises(ValueError, match="not tunable knobs: model, seeds; tunable: quantization"):
        search_space(include={"seeds"}, exclude={"model"})

    def choices(base: EngineArgs, name: str) -> tuple:
        return next(d for d in search_space(base=base) if d.name == name).spec.choices

    assert "sla" not in choices(EngineArgs(), "scheduling_policy")  # sla needs slo_classes
    assert "sla" in choices(SPEC_BASE, "scheduling_policy")
    assert "swap" in choices(EngineArgs(), "preemption_mode")
    assert "swap" not in choices(EngineArgs(swap_space=0), "preemption_mode")  # nothing to swap to
    threads = next(d for d in search_space() if d.name == "threads").spec
    assert (threads.low, threads.high) == (1, len(os.sched_getaffinity(0)))
    assert [d.name for d in search_space(include={"max_num_seqs", "block_size"})] == ["block_size", "max_num_seqs"]


@pytest.mark.parametrize("base", [EngineArgs(), SPEC_BASE, EngineArgs(two_batch_overlap=True, tensor_parallel_size=2)])
def test_every_sampled_point_is_one_the_engine_accepts(base):
    space = search_space(allow_output_changes=True, base=base)
    rng = np.random.default_rng(38)
    seen: dict[str, set] = {d.name: set() for d in space}
    for _ in range(200):
        point = sample(space, rng, base)
        assert list(point) == [d.name for d in space]
        args = validate_point(point, base)  # EngineArgs.check(): every check the engine makes without a model
        args.create_scheduler_config(max_model_len=8192)  # chunked prefill off raises the budget to this
        for d in space:
            seen[d.name].add(point[d.name])
            if d.spec.kind == "int" and point[d.name] is not None:
                assert type(point[d.name]) is int and d.spec.low <= point[d.name] <= d.spec.high, (d.name, point)
        if base is SPEC_BASE:
            spec = args.speculative_config
            assert spec["min_speculative_tokens"] <= spec["num_speculative_tokens"]
    # 200 draws reach both ends of every bool and choice the base leaves open.
    for d in space:
        if d.spec.kind != "int" and d.name not in ("two_batch_overlap", "data_parallel_attention"):
            assert seen[d.name] == set(d.spec.choices or (False, True)), d.name
    if "two_batch_overlap" in seen:  # with two ranks the exclusive layouts each get drawn on
        assert seen["two_batch_overlap"] == {False, True} and seen["data_parallel_attention"] == {False, True}


def test_log_ranges_draw_each_octave_alike():
    (dim,) = search_space(include={"max_num_batched_tokens"})
    rng = np.random.default_rng(0)
    drawn = np.array([sample([dim], rng)["max_num_batched_tokens"] for _ in range(6000)])
    octaves = np.histogram(np.log2(drawn), bins=6, range=(8, 14))[0]  # 256..16384: six octaves
    assert octaves.min() > 0.8 * octaves.max(), octaves


def test_validate_point_refuses_what_the_engine_refuses_naming_the_knobs():
    base = EngineArgs()
    with pytest.raises(ValueError, match=r"two_batch_overlap=True.*needs tensor_parallel_size >= 2"):
        validate_point({"two_batch_overlap": True, "tensor_parallel_size": 1}, base)
    with pytest.raises(ValueError, match=r"min_speculative_tokens=6.*must be an integer from 0 to"):
        validate_point(
            {"speculative_config.num_speculative_tokens": 2, "speculative_config.min_speculative_tokens": 6}, SPEC_BASE
        )
    with pytest.raises(ValueError, match="the base configuration sets no speculative_config"):
        validate_point({"speculative_config.num_speculative_tokens": 2}, base)
    with pytest.raises(ValueError, match="not tunable knobs: seed"):
        validate_point({"seed": 1}, base)
    with pytest.raises(ValueError, match=r"max_num_seqs=0.*must be an integer >= 1"):
        validate_point({"max_num_seqs": 0}, base)
    args = validate_point({"speculative_config.num_speculative_tokens": 6}, SPEC_BASE)
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 6}
    assert SPEC_BASE.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}  # the base is not changed


def test_rules_between_knobs_hold_a_point_inside_the_engine_checks():
    # A base that keeps two_batch_overlap on, with the flag itself not searched: one rank is never drawn.
    base = EngineArgs(tensor_parallel_size=2, two_batch_overlap=True)
    space = search_space(base=base, exclude={"two_batch_overlap"})
    rng = np.random.default_rng(1)
    points = [sample(space, rng, base) for _ in range(100)]
    assert {p["tensor_parallel_size"] for p in points} == {2, 4, 8}
    assert not any(p["data_parallel_attention"] for p in points)
    # The base's floor on drafts holds when only the ceiling is searched.
    base = EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 6, "min_speculative_tokens": 5})
    space = search_space(base=base, include={"speculative_config.num_speculative_tokens"})
    drawn = {sample(space, rng, base)["speculative_config.num_speculative_tokens"] for _ in range(100)}
    assert drawn == {5, 6, 7, 8}


def test_suggest_through_optuna():
    space = search_space(allow_output_changes=True, base=SPEC_BASE)
    # FixedTrial: a stored study's parameters replayed. A layout flag with one rank is not suggested.
    params = {"tensor_parallel_size": 1, "max_num_seqs": 32, "scheduling_policy": "sla", "aging_s": None}
    point = suggest(
        search_space(include=set(params) | {"two_batch_overlap"}, base=SPEC_BASE),
        optuna.trial.FixedTrial(params),
        SPEC_BASE,
    )
    assert point == {**params, "two_batch_overlap": False}
    # A real TPE study in memory: every trial's point valid, the conditional parameters recorded only when active.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))

    def objective(trial: optuna.Trial) -> float:
        args = validate_point(suggest(space, trial, SPEC_BASE), SPEC_BASE)
        return args.max_num_batched_tokens / args.max_num_seqs

    study.optimize(objective, n_trials=30)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    for t in study.trials:
        assert ("two_batch_overlap" in t.params) == (t.params["tensor_parallel_size"] >= 2)
        assert (
            t.params["speculative_config.min_speculative_tokens"]
            <= t.params["speculative_config.num_speculative_tokens"]
        )


def test_a_bad_tune_mark_is_refused_naming_its_knob():
    bad = [
        (TuneSpec("int", low=64, high=8, why="w"), 16, "tune mark of budget: low=64 is above high=8"),
        (TuneSpec("int", low=1, high=8, why="w"), 16, r"the default 16 is outside 1..8"),
        (TuneSpec("choice", choices=(1, 2), why="w"), 16, r"the default 16 is not among the choices \(1, 2\)"),
        (TuneSpec("choice", why="w"), 16, "choices is empty"),
        (TuneSpec("int", low=0, high=8, log=True, why="w"), 1, "log=True needs low >= 1"),
        (TuneSpec("float", why="w"), 1, "kind='float' is not known; valid: int, choice, bool"),
        (TuneSpec("bool"), False, "why is empty"),
        (TuneSpec("choice", choices=(1,), choices_need=((2, "x"),), why="w"), 1, "choices_need names 2"),
    ]
    for spec, default, message in bad:
        with pytest.raises(ValueError, match=message):

            @dataclass(frozen=True)
            class Args(Knobs):
                budget: int = knob(default, "scheduler", "h", tune=spec)

    with pytest.raises(ValueError, match=r"tune mark of spec\.k: low=3 is above high=1"):

        @dataclass(frozen=True)
        class Nested(Knobs):
            spec: dict | None = knob(None, "model", "h", tune={"k": TuneSpec("int", low=3, high=1, why="w")})

    @dataclass(frozen=True)
    class Good(Knobs):  # the negative control: the same shapes, valid, define
        budget: int = knob(16, "scheduler", "h", tune=TuneSpec("int", low=1, high=64, log=True, why="w"))

    assert Good().budget == 16
    assert Dimension("budget", TuneSpec("bool", why="w"), False).key is None
    assert Dimension("speculative_config.k", TuneSpec("bool", why="w"), None).field == "speculative_config"
