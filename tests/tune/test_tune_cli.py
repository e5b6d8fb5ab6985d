"""`tacit tune` end to end where it runs in seconds: the model-only stage for a part we do not
have (recipe, README and report written), the committed scenarios, bad input refused by name, and
--compare alternating configurations (one under --adaptive) on a tiny random model."""

from __future__ import annotations

import json

import pytest

from tacit.cli import main
from tacit.config.engine_args import EngineArgs
from tacit.tune.model_stage import ModelStage
from tacit.tune.scenario import load_scenario, scenario_names, workload_scenario


def test_the_committed_scenarios_load_with_their_slos():
    assert scenario_names() == ["chat-high-rate", "retrieval-long", "bursty-priority"]
    bursty = load_scenario("bursty-priority")
    assert {w.priority for w in bursty.workload} == {0, 1} and len(bursty.workload) == 60
    assert bursty.slo.for_priority(1) == {"ttft": 30.0, "tpot": 1.0} and bursty.slo.for_priority(0)["ttft"] == 1.0
    with pytest.raises(ValueError, match="'nope' is not known; valid: chat-high-rate"):
        load_scenario("nope")
    with pytest.raises(ValueError, match="--workload needs --slo"):
        workload_scenario(bursty.source, None)


def test_the_model_stage_prices_a_point_and_names_an_invalid_one():
    stage = ModelStage(EngineArgs(), "random:qwen3-100m", load_scenario("bursty-priority"), "goodput", "h100-sxm")
    p = stage.predict({"max_num_seqs": 8})
    assert p.scores["completed"] == 60 and p.value == p.scores["goodput_req_s"] > 0
    bad = stage.predict({"max_num_seqs": 0})
    assert bad.scores is None and "max_num_seqs" in bad.error


def test_model_only_tuning_writes_a_recipe_serve_takes(tmp_path, capsys):
    out = tmp_path / "h100"
    argv = ["tune", "--model", "random:qwen3-100m", "--scenario", "bursty-priority", "--hardware", "h100-sxm"]
    assert main([*argv, "--model-trials", "8", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"].startswith("Predicted only (no measurement on h100-sxm)")
    assert len(report["model_top"]) == 5 and "tacit tune --model random:qwen3-100m" in report["command"]
    assert "## The model-only stage's best points" in (out / "README.md").read_text()
    EngineArgs.from_kwargs(recipe=str(out)).check()  # what `tacit serve --recipe` loads


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--scenario", "chat-high-rate", "--slo", "ttft=5"], "--slo goes with --workload"),
        (["--scenario", "chat-high-rate", "--budget-minutes", "0"], "--budget-minutes must be > 0"),
        (["--scenario", "chat-high-rate", "--rank-check", "2"], "--rank-check N needs N >= 3"),
        (["--scenario", "chat-high-rate", "--rank-check", "3", "--repeats", "0"], "--repeats must be >= 1"),
        (["--scenario", "chat-high-rate", "--compare", "nowhere"], "no recipe at nowhere"),
        (["--scenario", "chat-high-rate", "--accuracy-budget", "0"], "--accuracy-budget must be a mean KL"),
        (["--scenario", "chat-high-rate", "--accuracy-budget", "nan"], "--accuracy-budget must be a mean KL"),
        (
            ["--scenario", "chat-high-rate", "--accuracy-budget", "0.01", "--hardware", "h100-sxm"],
            "--accuracy-budget goes with a measured search",
        ),
    ],
)
def test_bad_tune_flags_are_refused_by_name(tmp_path, argv, message, capsys):
    assert main(["tune", *argv, "--out", str(tmp_path)]) != 0
    assert message in capsys.readouterr().err


def test_compare_alternates_configurations_one_under_adaptive(tiny_llama, tmp_path, capsys):
    _, _, model_dir = tiny_llama
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        "".join(
            json.dumps({"arrival_s": 0.05 * i, "input_len": 24 + i, "output_len": 6, "priority": i % 2}) + "\n"
            for i in range(6)
        )
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text("scheduler:\n  max_num_seqs: 2\n")
    argv = ["tune", "--model", str(model_dir), "--dtype", "float32", "--workload", str(workload)]
    argv += ["--slo", "ttft=5000,tpot=1000", "--compare", "default", str(recipe), "adaptive:default"]
    assert main([*argv, "--repeats", "2", "--out", str(tmp_path / "c")]) == 0
    result = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert list(result["summary"]) == ["default", str(recipe), "adaptive:default"]
    for label, row in result["summary"].items():
        assert row["runs"] == 2 and row["failed"] == 0 and row["goodput_mean"] > 0, label
    assert "goodput_ratio" in result["summary"][str(recipe)] and "p99_ttft_std_s" in result["summary"]["default"]
    assert "2 alternated rounds" in capsys.readouterr().out
