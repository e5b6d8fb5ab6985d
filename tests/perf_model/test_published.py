"""The published-figure set (tacit/perf_model/data/published.yaml) and `tacit predict --published`."""

from __future__ import annotations

import contextlib
import copy
import io
import json

import pytest
import yaml

from tacit.cli import main
from tacit.perf_model.cli import predict_parser
from tacit.perf_model.published import (
    KINDS,
    METRICS,
    PLATFORMS,
    Result,
    check_entry,
    load_entries,
    run_entry,
    run_published,
    summarize,
)

RUNNABLE = "--model Llama-2-7B --hardware a100-80g --batch-size 2 --input-len 16 --output-len 8"


def _entry(**over) -> dict:
    e = {
        "id": "synthetic",
        "platform": "nvidia",
        "kind": "small_batch_decode",
        "source": {"repository": "example/repo", "path": "README.md"},
        "quote": "| model | 100 |",
        "conditions": {k: "x" for k in ("model", "hardware", "layout", "batch", "lengths", "precision", "engine")},
        "caveats": ["none known"],
        "metric": "tpot_ms",
        "value": 100.0,
        "command": RUNNABLE,
    }
    e.update(over)
    return e


def test_every_shipped_figure_has_its_source_quote_conditions_and_a_known_category():
    entries = load_entries()
    assert len(entries) >= 20
    for e in entries:
        src = e["source"]
        assert src.get("url") or (src.get("repository") and src.get("path")), e["id"]
        assert e["quote"].strip() and e["caveats"], e["id"]
        assert e["platform"] in PLATFORMS and e["kind"] in KINDS and e["metric"] in METRICS, e["id"]
        assert e["value"] > 0 and e["command"].startswith("--model "), e["id"]
    # Every platform is represented: the set is a gauge across them, not of one.
    assert {e["platform"] for e in entries} == set(PLATFORMS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quote": ""}, "missing quote"),
        ({"kind": "decode"}, "kind 'decode'"),
        ({"platform": "tpu"}, "platform 'tpu'"),
        ({"metric": "tokens"}, "metric 'tokens'"),
        ({"source": {"repository": "example/repo"}}, "source needs a url"),
        ({"value": -3}, "must be a positive number"),
        ({"command": RUNNABLE + " --json out.json"}, "may not carry --json"),
    ],
)
def test_a_figure_without_what_it_needs_is_refused_by_name(change, message):
    with pytest.raises(ValueError, match="synthetic") as err:
        check_entry(_entry(**change))
    assert message in str(err.value)


def test_missing_conditions_are_named():
    e = _entry()
    del e["conditions"]["engine"]
    with pytest.raises(ValueError, match="conditions lack engine"):
        check_entry(e)


def test_summary_median_and_p90_by_hand():
    # Five expressible figures, |errors| 0.10, 0.20, 0.50, 0.00, 0.05 -> sorted 0, .05, .10, .20, .50:
    # median 0.10; p90 is the value at rank round(0.9 x 4) = 4 of 0..4: 0.50. One more figure is
    # not expressible: counted, not in the statistics.
    predicted = [110.0, 80.0, 150.0, 100.0, 95.0]
    results = [Result(_entry(id=f"f{i}"), p) for i, p in enumerate(predicted)]
    results.append(Result(_entry(id="f5", kind="prefill"), None, "ValueError: no"))
    s = summarize(results)
    assert s["all"]["figures"] == 6 and s["all"]["expressible"] == 5
    assert s["all"]["median_abs_err"] == pytest.approx(0.10)
    assert s["all"]["p90_abs_err"] == pytest.approx(0.50)
    assert s["nvidia/small_batch_decode"]["expressible"] == 5
    assert s["nvidia/prefill"] == {"figures": 1, "expressible": 0, "median_abs_err": None, "p90_abs_err": None}
    assert s["prefill"]["figures"] == 1 and s["nvidia"]["figures"] == 6


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (RUNNABLE + " --no-such-layout 3", "unrecognized arguments: --no-such-layout 3"),
        (RUNNABLE.replace("--batch-size 2", "--batch-size two"), "invalid int value: 'two'"),
        (RUNNABLE.replace("a100-80g", "a100-40g"), "a100-40g"),
    ],
)
def test_a_command_the_code_cannot_run_is_not_expressible_and_says_why(command, message):
    r = run_entry(_entry(command=command), predict_parser())
    assert r.predicted is None and r.rel_error is None
    assert message in r.error


def _cli_json(tmp_path, command: str) -> dict:
    out = tmp_path / "p.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["predict", *command.split(), "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_a_runnable_figure_reads_the_metric_the_cli_writes(tmp_path):
    cli = _cli_json(tmp_path, RUNNABLE)
    assert run_entry(_entry(metric="tpot_ms"), predict_parser()).predicted == pytest.approx(cli["tpot_ms"])
    # decode_tok_s: 2 sequences a token each every TPOT; scale turns a deployment figure per node.
    r = run_entry(_entry(metric="decode_tok_s", value=500.0, scale=0.5), predict_parser())
    assert r.predicted == pytest.approx(0.5 * 2 * 1e3 / cli["tpot_ms"])
    assert r.rel_error == pytest.approx(r.predicted / 500.0 - 1)


def test_run_published_reports_every_figure_and_writes_rows(tmp_path, capsys):
    good = _entry(id="good")
    bad = _entry(id="bad", platform="cpu", command=RUNNABLE + " --bogus")
    path = tmp_path / "figures.yaml"
    path.write_text(yaml.safe_dump([good, copy.deepcopy(bad)]))
    out = tmp_path / "out.json"
    assert run_published(str(out), predict_parser(), path) == 0
    text = capsys.readouterr().out
    assert "good" in text and "bad" in text and "not expressible: ValueError: unrecognized arguments" in text
    data = json.loads(out.read_text())
    rows = {r["id"]: r for r in data["rows"]}
    assert rows["good"]["predicted"] > 0 and rows["good"]["not_expressible"] is None
    assert rows["bad"]["predicted"] is None and "--bogus" in rows["bad"]["not_expressible"]
    assert data["summary"]["all"] == {
        "figures": 2,
        "expressible": 1,
        "median_abs_err": pytest.approx(abs(rows["good"]["error"])),
        "p90_abs_err": pytest.approx(abs(rows["good"]["error"])),
    }


def test_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "figures.yaml"
    path.write_text(yaml.safe_dump([_entry(), _entry()]))
    with pytest.raises(ValueError, match="id 'synthetic' appears twice"):
        load_entries(path)


def test_a_relative_hardware_file_is_a_published_box_beside_the_figures(tmp_path, monkeypatch):
    from tacit.perf_model.hardware_file import load_hardware_file
    from tacit.perf_model.published import PUBLISHED_FILE

    boxes = sorted((PUBLISHED_FILE.parent / "hardware").glob("*.yaml"))
    assert boxes
    for box in boxes:
        load_hardware_file(box)  # every shipped box loads
    monkeypatch.chdir(tmp_path)  # nothing beside the runner's working directory
    command = (
        f"--model Llama-2-7B --hardware-file hardware/{boxes[0].name} --batch-size 1 --input-len 16 --output-len 8"
    )
    rel = run_entry(_entry(command=command, platform="cpu"), predict_parser())
    absolute = run_entry(_entry(command=command.replace("hardware/", f"{boxes[0].parent}/")), predict_parser())
    assert rel.predicted is not None and rel.predicted == absolute.predicted
    equals = run_entry(_entry(command=command.replace("--hardware-file ", "--hardware-file=")), predict_parser())
    assert equals.predicted == rel.predicted
    missing = run_entry(_entry(command=command.replace(boxes[0].name, "none.yaml")), predict_parser())
    assert missing.predicted is None and "none.yaml: cannot be read" in missing.error


def test_the_kimi_box_is_the_table_entry_but_for_its_measured_memory():
    from tacit.perf_model.hardware_file import load_hardware_file
    from tacit.perf_model.published import PUBLISHED_FILE
    from tacit.platforms.hardware_table import get_hardware_spec

    box = load_hardware_file(PUBLISHED_FILE.parent / "hardware" / "epyc-9965-mlc-256gib.yaml")
    table = get_hardware_spec("epyc-9965")
    for dtype, v in table.flops.items():
        assert box.flops[dtype].value == pytest.approx(v.value, rel=1e-9)
    assert box.cores == table.cores and box.efficiency_profile == table.efficiency_profile
    # 256 GiB/s read by mlc, over 0.90: the 6980P box's mlc read of its DDR5-6400 peak (555 / 614.4)
    assert 555 / 614.4 == pytest.approx(0.90, abs=0.005)
    assert box.memory_bandwidth.value == pytest.approx(256 * 2**30 / 0.90, rel=1e-3)
