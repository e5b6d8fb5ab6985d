"""`tacit tune --accuracy-budget`: output-changing knobs searched only under a KLD check."""

from __future__ import annotations

import json

from tacit.config.engine_args import EngineArgs
from tacit.tune.accuracy import AccuracyGate
from tacit.tune.recipe_out import write_readme
from tacit.tune.space import output_changing_knobs, search_space


def _measure(point):
    return 1.0, {"goodput": 1.0}, ""


def test_the_budget_opens_exactly_the_output_changing_knobs():
    assert set(output_changing_knobs()) == {"quantization", "kv_cache_dtype"}
    base = EngineArgs(model="m")
    closed = {d.name for d in search_space(base=base, stage="measured")}
    opened = {d.name for d in search_space(True, base=base, stage="measured")}
    assert opened - closed == {"quantization", "kv_cache_dtype"}


def test_a_point_over_the_budget_is_infeasible_before_it_is_measured(tmp_path):
    calls, measured = [], []
    klds = {("int8", "auto"): 0.004, ("int4", "auto"): 0.09}

    def kld(model: EngineArgs, reference: EngineArgs) -> float:
        assert reference.quantization == "auto" and reference.kv_cache_dtype == "auto"
        calls.append((model.quantization, model.kv_cache_dtype))
        return klds[calls[-1]]

    def measure(point):
        measured.append(point)
        return _measure(point)

    gate = AccuracyGate(EngineArgs(model="m"), 0.01, tmp_path / "accuracy.json", kld)
    gated = gate(measure)
    assert gated({"max_num_seqs": 8, "quantization": "auto"}) == _measure(None)  # the base's value: no check
    assert calls == []
    assert gated({"quantization": "int8", "max_num_seqs": 4})[0] == 1.0
    value, scores, error = gated({"quantization": "int4"})
    assert (value, scores) == (None, None) and error == "quantization=int4: mean KLD 0.09 over the accuracy budget 0.01"
    gated({"quantization": "int8", "max_num_seqs": 16})  # checked once per combination
    assert calls == [("int8", "auto"), ("int4", "auto")]
    assert [p.get("quantization") for p in measured] == ["auto", "int8", "int8"]
    # persisted: a resumed study does not check again
    again = AccuracyGate(EngineArgs(model="m"), 0.01, tmp_path / "accuracy.json", kld)
    again({"quantization": "int4"})
    assert len(calls) == 2
    assert AccuracyGate(EngineArgs(model="other"), 0.01, tmp_path / "accuracy.json", kld).checks == {}
    assert again.report() == [
        {"changes": {"quantization": "int8"}, "kld_mean": 0.004, "within_budget": True},
        {"changes": {"quantization": "int4"}, "kld_mean": 0.09, "within_budget": False},
    ]


def test_a_check_that_cannot_load_is_an_infeasible_trial(tmp_path):
    def kld(model, reference):
        raise RuntimeError("int8 needs a Hugging Face checkpoint")

    gated = AccuracyGate(EngineArgs(model="m"), 0.01, tmp_path / "a.json", kld)(_measure)
    assert gated({"kv_cache_dtype": "int8"}) == (None, None, "accuracy check: int8 needs a Hugging Face checkpoint")
    assert not (tmp_path / "a.json").exists()


def test_the_readme_lists_each_check(tmp_path):
    report = json.loads(
        json.dumps(
            {
                "name": "n",
                "scenario": "s",
                "scenario_description": "d",
                "objective": "goodput",
                "slo": "x",
                "hardware": "this-cpu",
                "command": "tacit tune",
                "defaults": {},
                "verdict": "v",
                "accuracy_budget": 0.01,
                "accuracy": [{"changes": {"quantization": "int4"}, "kld_mean": 0.09, "within_budget": False}],
            }
        )
    )
    text = write_readme(tmp_path, report).read_text()
    assert "under a budget of 0.01 mean KLD" in text and "| quantization=int4 | 0.09 | no |" in text
