"""`tacit profile` end to end on a tiny model: profile.json's contents, the HTML report, bad input."""

import json
from html.parser import HTMLParser

import pytest

from tacit.cli import main
from tacit.profiler.categories import CATEGORIES
from tacit.profiler.html_report import SECTIONS, render

# this-cpu pricing reads this machine's calibration: seeded, never fitted, in tests
pytestmark = pytest.mark.usefixtures("this_cpu_calibrated")


class Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.ids, self.links = [], set(), []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        self.links += [v for k, v in attrs if k in ("src", "href") and v]


@pytest.fixture(scope="module")
def profile_dir(tiny_llama, tmp_path_factory):
    _, _, path = tiny_llama
    out = tmp_path_factory.mktemp("prof")
    workload = out / "workload.json"
    workload.write_text(
        json.dumps(
            [
                {"input_len": 12, "output_len": 5},
                {"input_len": 9, "output_len": 5},
                {"input_len": 6, "output_len": 2, "arrival_step": 2},
            ]
        )
    )
    args = ["profile", "--model", str(path), "--block-size", "4", "--workload", str(workload), "--no-measure-hw"]
    assert main(args + ["--out", str(out)]) == 0
    return out


def test_profile_json_has_kinds_layers_categories(profile_dir):
    p = json.loads((profile_dir / "profile.json").read_text())
    assert set(p["kinds"]) == {"prefill", "decode", "mixed"}
    assert p["categories"] == list(CATEGORIES)
    assert p["hw"] is None  # --no-measure-hw without --hw-json
    for kind, k in p["kinds"].items():
        assert set(k["categories"]) == set(CATEGORIES)
        for st in k["categories"].values():
            assert {"median", "p10", "p90", "mean", "stdev"} <= set(st)
            assert st["p10"] <= st["median"] <= st["p90"]
        assert {"layers.0", "layers.1", "head"} <= set(k["layers"]) == set(k["layers_median"])
        assert k["layers"]["layers.0"]["gemm"] > 0
        # the means over classes add up to the mean step
        assert sum(st["mean"] for st in k["categories"].values()) == pytest.approx(k["step_s"]["mean"], rel=0.03)
        for c in ("gemm", "attention", "norm"):
            r = k["roofline"][c]
            assert r["intensity"] > 0 and r["achieved_flops"] > 0
    assert p["communication"] == {}  # one process
    assert len(p["steps"]) == sum(k["steps"] for k in p["kinds"].values())
    # Random prompts share nothing: every token computed, none from the prefix cache.
    assert p["tokens"] == {"computed": sum(r[0] for st in p["steps"] for r in st["rows"]), "cached": 0}


def test_report_is_self_contained_with_every_section(profile_dir, tmp_path):
    p = json.loads((profile_dir / "profile.json").read_text())
    for html in ((profile_dir / "report.html").read_text(), render(p)):
        parser = Collect()
        parser.feed(html)
        assert not [u for u in parser.links if "//" in u or u.startswith("http")], parser.links
        assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
        assert set(SECTIONS) <= parser.ids
        assert parser.tags.count("svg") >= 1 + 2 * len(p["kinds"])  # breakdown, per-kind layers and rooflines
        assert "Predicted (tacit predict on this-cpu)" in html and "No communication" in html
    bare = render({**p, "predicted": {}, "deviations": {}, "predicted_by": "--predict-hardware none"})
    assert "Nothing to compare: --predict-hardware none." in bare


def test_roofs_and_prediction_render(profile_dir, tmp_path):
    from tacit.profiler.roofline import Roofs
    from tacit.profiler.summary import check_predicted, deviations

    p = json.loads((profile_dir / "profile.json").read_text())
    roofs = Roofs(20e9, 1e12, "test")
    p["hw"] = roofs.to_json()
    assert p["hw"]["ridge"] == pytest.approx(50.0)
    decode = p["kinds"]["decode"]["categories"]
    pred = {"gemm": decode["gemm"]["mean"] * 2, "attention": decode["attention"]["mean"], "host": 0.0}
    p["predicted"] = check_predicted(pred)
    p["deviations"] = deviations(p["kinds"], p["predicted"])
    rows = p["deviations"]["decode"]
    assert [abs(r["deviation_s"]) for r in rows] == sorted((abs(r["deviation_s"]) for r in rows), reverse=True)
    html = render(p)
    assert "ridge 50.0 FLOP/B" in html and "largest deviation first" in html
    with pytest.raises(ValueError, match="not a step kind"):
        check_predicted({"warmup": {"gemm": 1.0}})


def test_hw_json_from_bench_hw(tiny_llama, tmp_path):
    from tacit.profiler.roofline import roofs_from_file

    f = tmp_path / "hw.json"
    f.write_text(json.dumps({"read_GBps": 18.0, "tacit_gemv_GBps": 24.0, "bf16_matmul_TFLOPs": 1.2}))
    r = roofs_from_file(f)
    assert r.read_Bps == 24e9 and r.ridge == pytest.approx(50.0)
    f.write_text(json.dumps({"copy_GBps": 1.0}))
    with pytest.raises(ValueError, match="bf16_matmul_TFLOPs"):
        roofs_from_file(f)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--output-len", "-3"], "--output-len must be at least 1"),
        (["--workload", "/nonexistent/w.json"], "--workload /nonexistent/w.json: no such file"),
        (["--workload", "W", "--batch-size", "2"], "either --workload or --batch-size"),
        (["--hw-json", "/nonexistent/hw.json", "--batch-size", "1"], "tacit bench hw --json"),
    ],
)
def test_bad_input_is_refused_clearly(tiny_llama, tmp_path, capsys, extra, message):
    _, _, path = tiny_llama
    assert main(["profile", "--model", str(path), "--out", str(tmp_path), *extra]) == 2
    assert message in capsys.readouterr().err


def test_bad_workload_contents(tmp_path):
    from tacit.profiler.cli import load_workload

    f = tmp_path / "w.json"
    for content, message in [
        ("[]", "non-empty JSON list"),
        ('[{"input_len": 4}]', "needs integer input_len and output_len"),
        ('[{"input_len": 0, "output_len": 2}]', "must be >= 1"),
        ('[{"input_len": 3, "output_len": 2, "prompt": "x"}]', "may hold only"),
        ("{oops", "not JSON"),
    ]:
        f.write_text(content)
        with pytest.raises(ValueError, match=message):
            load_workload(str(f))


def test_predicted_column_comes_from_the_performance_model(profile_dir):
    """By default the run is priced by `tacit predict` on this-cpu: both step kinds, every class."""
    p = json.loads((profile_dir / "profile.json").read_text())
    assert p["predicted_by"] == "tacit predict on this-cpu"
    assert set(p["predicted"]) == {"prefill", "decode"}
    for per in p["predicted"].values():
        assert set(per) == set(CATEGORIES) and per["gemm"] > 0 and per["attention"] > 0
    assert p["deviations"]["decode"] and p["deviations"]["prefill"]
    assert "tacit predict on this-cpu" in render(p)


def test_unknown_prediction_hardware_is_refused(tiny_llama, tmp_path, capsys):
    _, _, path = tiny_llama
    args = ["profile", "--model", str(path), "--out", str(tmp_path), "--predict-hardware", "tpu-v9"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--predict-hardware 'tpu-v9' is not known" in err and "h200-sxm" in err and "none" in err


def test_an_uncalibrated_cpu_is_said_not_fitted_behind_the_users_back(tiny_llama, tmp_path, monkeypatch):
    """No calibration for this machine: the default pricing on this-cpu does not start a
    minute-long fit; the report says why there is no predicted column and how to get one."""
    from tacit.perf_model import calibration

    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path / "empty")
    _, _, path = tiny_llama
    args = ["profile", "--model", str(path), "--batch-size", "1", "--input-len", "6", "--output-len", "2"]
    assert main(args + ["--no-measure-hw", "--repeats", "1", "--out", str(tmp_path)]) == 0
    p = json.loads((tmp_path / "profile.json").read_text())
    assert p["predicted_by"].startswith("this CPU is not calibrated (no calibration for this machine")
    assert "`tacit predict --calibrate` fits it" in p["predicted_by"] and not p["predicted"]
    assert "Nothing to compare: this CPU is not calibrated" in (tmp_path / "report.html").read_text()
