"""tacit tune's stages on fakes (the measured trials replaced by known values) and its outputs:
model_search ranks with the default first on a tie, the measured study records infeasible trials
and resumes from SQLite without re-enqueueing, the confirmation alternates with the default and
only a ratio whose interval clears 1 replaces it, and the recipe reads back as it was tuned."""

from __future__ import annotations

import math

import pytest

from tacit.config.engine_args import EngineArgs
from tacit.tune.model_stage import Prediction
from tacit.tune.recipe_out import point_words, write_recipe
from tacit.tune.run import spearman
from tacit.tune.search import Confirmation, MeasuredSearch, model_search
from tacit.tune.space import search_space

BASE = EngineArgs()
SPACE = search_space(base=BASE, include={"max_num_seqs", "max_num_batched_tokens", "scheduling_policy"})


class FakeStage:
    """Goodput falls with max_num_seqs away from 16; the default prices as well as the best."""

    def predict(self, point):
        if point.get("scheduling_policy") == "sjf":
            return Prediction(point, None, -math.inf, "refused")
        seqs = point.get("max_num_seqs", 16)
        return Prediction(point, {"goodput_req_s": 1.0}, 2.0 - abs(math.log2(seqs / 16)) / 10)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.866, abs=1e-3)  # tied ranks share the mean
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_model_search_ranks_best_first_and_keeps_the_default_ahead_of_a_tie():
    ranked = model_search(FakeStage(), SPACE, BASE, n_trials=30, seed=0)
    assert ranked[0].point == {}  # max_num_seqs 16 is not the default (64), but no point beats 2.0 by 1%
    values = [p.value for p in ranked[1:]]
    assert values == sorted(values, reverse=True) and len(ranked) > 10
    assert any(not math.isfinite(p.value) for p in ranked)  # the refused ones are kept, last


def fake_run(calls):
    def run(point):
        calls.append(point)
        if point.get("scheduling_policy") == "sjf":
            return None, None, "the engine could not be built: boom"
        seqs = point.get("max_num_seqs", BASE.max_num_seqs)
        v = 3.0 if seqs <= 16 else 1.0
        return v, {"goodput_req_s": v}, ""

    return run


def test_the_measured_study_records_infeasible_trials_and_resumes(tmp_path):
    calls = []
    s = MeasuredSearch(tmp_path, "t", SPACE, BASE, fake_run(calls), lambda p: 1.5, seed=0)
    s.enqueue([{}, {"max_num_seqs": 8}, {"scheduling_policy": "sjf"}])
    trials = [s.step() for _ in range(5)]
    assert calls[0] == {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "scheduling_policy": "fcfs"}
    assert calls[1]["max_num_seqs"] == 8 and calls[2]["scheduling_policy"] == "sjf"  # the enqueued, in order
    assert trials[2].value is None and "boom" in trials[2].error and trials[2].predicted == 1.5
    assert trials[1].value == 3.0 and trials[0].value == 1.0 and (tmp_path / "study.db").exists()
    again = MeasuredSearch(tmp_path, "t", SPACE, BASE, fake_run(calls), lambda p: 1.5, seed=0)
    again.enqueue([{}])  # a resumed study is not re-seeded with the picks
    assert len(again.trials()) == 5 and again.step().number == 5


def test_confirmation_alternates_with_the_default_and_resumes(tmp_path):
    calls = []
    s = MeasuredSearch(tmp_path, "t", SPACE, BASE, fake_run(calls), lambda p: None)
    s.enqueue([{}, {"max_num_seqs": 8}])
    s.step(), s.step()
    conf = s.candidates()
    assert [c.point["max_num_seqs"] for c in conf] == [8]  # the default is never its own candidate
    calls.clear()
    s.confirm_round(conf, 0)
    s.confirm_round(conf, 1)
    assert [c.get("max_num_seqs") for c in calls] == [None, 8, 8, None]  # the order flips each round
    kept = MeasuredSearch(tmp_path, "t", SPACE, BASE, fake_run(calls), lambda p: None).candidates()
    assert kept[0].values == [3.0, 3.0] and kept[0].defaults == [1.0, 1.0]


def test_a_ratio_is_better_over_the_default_for_both_directions():
    up = Confirmation({}, [3.0, 3.1, 2.9], [1.0, 1.1, 0.9]).ratio()
    assert 2.5 < up[0] < 3.5 and up[1] > 1
    down = Confirmation({}, [-1.0, -1.1], [-2.0, -2.2]).ratio()  # p99 TTFT halved (stored negated)
    assert down[0] == pytest.approx(2.0, rel=0.1)
    assert Confirmation({}, [3.0], [1.0]).ratio() is None  # one round is no interval


def test_the_recipe_reads_back_as_tuned(tmp_path):
    from dataclasses import replace

    args = replace(BASE, model="some/model", max_num_seqs=8, scheduling_policy="priority", block_size=32)
    path = write_recipe(tmp_path, "t", "a test", "this-cpu", args, "why\non two lines")
    text = path.read_text()
    assert text.startswith("# why\n# on two lines\n") and "model:" not in text.split("name:")[1].split("cache:")[0]
    loaded = EngineArgs.from_kwargs(recipe=str(tmp_path))  # what `tacit serve --recipe DIR` reads
    assert (loaded.max_num_seqs, loaded.scheduling_policy, loaded.block_size) == (8, "priority", 32)
    assert point_words({"a": 1, "b": 2}, {"a": 1}) == "b=2" and point_words({}, {}) == "the defaults"


def _concluded(tmp_path, values, defaults):
    from tacit.tune.objective import SLO
    from tacit.tune.run import TuneRequest, _conclude
    from tacit.tune.scenario import Scenario

    s = MeasuredSearch(tmp_path, "t", SPACE, BASE, fake_run([]), lambda p: None)
    conf = [Confirmation({"max_num_seqs": 8}, values, defaults)]
    scenario = Scenario("s", "a test", [], SLO(default={"ttft": 1.0}), "w.jsonl")
    req = TuneRequest(BASE, "m", scenario, out_dir=tmp_path, command="tacit tune ...")
    report = {"name": "t", "scenario_description": "a test", "defaults": {"max_num_seqs": 64}}
    report.update(scenario="s", objective="goodput", slo="", hardware="h", command=req.command)
    report = _conclude(req, s, conf, report, 1.0)
    return report, EngineArgs.from_kwargs(recipe=str(tmp_path))


def test_a_candidate_replaces_the_defaults_only_when_its_interval_clears_one(tmp_path):
    report, recipe = _concluded(tmp_path / "a", [3.0, 3.1, 2.9], [1.0, 1.1, 0.9])
    assert recipe.max_num_seqs == 8 and report["verdict"].startswith("max_num_seqs=8: ")
    report, recipe = _concluded(tmp_path / "b", [1.0, 1.4, 0.8], [1.1, 0.9, 1.2])
    assert recipe.max_num_seqs == BASE.max_num_seqs and report["verdict"].startswith("The defaults stay")
