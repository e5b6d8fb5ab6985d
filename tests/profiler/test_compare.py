"""`tacit profile --compare A B`: the table's numbers and order, the report's bars, the header's
warnings, a kind present in one profile only, and paths that are not profiles."""

import json
from html.parser import HTMLParser

import pytest

from tacit.cli import main
from tacit.profiler.collect import StepRecord
from tacit.profiler.roofline import ModelShapes
from tacit.profiler.summary import summarize


def write_profile(directory, steps, model="tiny-a", device="cpu-x, 2 cores"):
    """A profile.json as `tacit profile` writes it (summary.summarize, json.dumps), from steps
    whose class seconds are given: every step of a kind alike, so each mean is exact."""
    records = [
        StepRecord(kind, sum(cats.values()), [(n, 0)], 1, {}, categories=cats)
        for kind, n, cats, count in steps
        for _ in range(count)
    ]
    meta = {
        "device": device,
        "model": {"name": model, "dtype": "bfloat16", "num_layers": 2, "weight_bytes": 1000},
        "engine": {"tensor_parallel_size": 1, "fused_decode": True, "block_size": 16},
        "workload": {"requests": [{"input_len": 8, "output_len": 4, "arrival_step": 0}], "repeats": 1},
        "ranks": [],
    }
    directory.mkdir(parents=True, exist_ok=True)
    profile = summarize(records, ModelShapes({}, 0, 0, 0), None, meta)
    (directory / "profile.json").write_text(json.dumps(profile, indent=1))
    return directory


@pytest.fixture
def two_profiles(tmp_path):
    a = write_profile(
        tmp_path / "a",
        [
            ("prefill", 8, {"gemm": 0.010, "attention": 0.004, "host": 0.001}, 2),
            ("decode", 1, {"gemm": 0.003, "attention": 0.001, "host": 0.0005}, 4),
        ],
    )
    b = write_profile(
        tmp_path / "b",
        [
            ("prefill", 8, {"gemm": 0.006, "attention": 0.005, "host": 0.001}, 2),
            ("decode", 1, {"gemm": 0.003, "attention": 0.0005, "host": 0.00025}, 3),
            ("verify", 3, {"gemm": 0.004, "proposer": 0.002, "host": 0.001}, 1),
        ],
    )
    return a, b


def section(text, kind):
    """The table lines of one step kind's section of the printed comparison, as split cells."""
    lines = text.split(f"\n{kind} (", 1)[1].split("\n\n")[0].splitlines()
    return lines[0], [line.split() for line in lines[2:]]  # past the kind's line and the header


def test_table_numbers_order_and_totals(two_profiles, tmp_path, capsys):
    a, b = two_profiles
    # A directory and a profile.json are both accepted.
    assert main(["profile", "--compare", str(a), str(b / "profile.json"), "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    title, rows = section(text, "prefill")
    assert title == "A 2 steps, B 2 steps): mean ms per step, largest change first"
    # GEMM -4 ms, attention +1 ms, host unchanged: largest |B - A| first, the total last.
    assert rows == [
        ["GEMM", "10.000", "6.000", "0.60x", "-4.000"],
        ["attention", "4.000", "5.000", "1.25x", "+1.000"],
        ["Python/host", "1.000", "1.000", "1.00x", "+0.000"],
        ["total", "15.000", "12.000", "0.80x", "-3.000"],
    ]
    _, rows = section(text, "decode")
    assert [r[0] for r in rows] == ["attention", "Python/host", "GEMM", "total"]
    assert rows[-1] == ["total", "4.500", "3.750", "0.83x", "-0.750"]
    # Present in B only: shown as absent in A, its own classes largest first, no ratio.
    title, rows = section(text, "verify")
    assert title.startswith("absent in A, B 1 step)")
    assert rows[0] == ["GEMM", "absent", "4.000", "-", "-"] and rows[1][:3] == ["draft", "proposer", "absent"]
    assert "warning" not in text  # same model, same device

    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    gemm = cmp["kinds"]["prefill"]["rows"][0]
    assert (
        gemm["category"] == "gemm" and gemm["ratio"] == pytest.approx(0.6) and gemm["diff_s"] == pytest.approx(-0.004)
    )
    assert cmp["kinds"]["verify"]["a_steps"] == 0 and cmp["kinds"]["verify"]["total"]["a_s"] is None
    # Classes without time in either profile are left out.
    assert {r["category"] for r in cmp["kinds"]["prefill"]["rows"]} == {"gemm", "attention", "host"}


class Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.titles, self.links, self._in_title = [], [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_title = tag == "title"
        self.links += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_data(self, data):
        if self._in_title:
            self.titles.append(data)
            self._in_title = False


def test_report_has_both_profiles_bars(two_profiles, tmp_path):
    a, b = two_profiles
    assert main(["profile", "--compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    html = (tmp_path / "cmp" / "report.html").read_text()
    parser = Collect()
    parser.feed(html)
    assert not parser.links and "script" not in parser.tags
    assert parser.tags.count("svg") == 3  # prefill, decode, verify
    # svg.stacked_bars' segment titles: A's bar and B's bar of each kind.
    for title in ("A: GEMM 10.000 ms", "B: GEMM 6.000 ms", "A: attention 1.000 ms", "B: attention 0.500 ms"):
        assert title in parser.titles, parser.titles
    assert "B: draft proposer 2.000 ms" in parser.titles
    assert not [t for t in parser.titles if t.startswith("A: ") and "proposer" in t]
    assert "No verify steps in A." in html and "<td>absent</td>" in html


def test_different_model_and_device_warn_but_compare(tmp_path, capsys):
    one = [("decode", 1, {"gemm": 0.002, "host": 0.001}, 2)]
    a = write_profile(tmp_path / "a", one)
    b = write_profile(tmp_path / "b", one, model="tiny-b", device="NVIDIA H100, 1 cores")
    assert main(["profile", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "warning: different models: A tiny-a (bfloat16, 2 layers), B tiny-b (bfloat16, 2 layers)" in out
    assert "warning: different devices: A cpu-x, 2 cores, B NVIDIA H100, 1 cores" in out
    assert "total" in out and not (tmp_path / "profile-out").exists()  # no --out: printed only


def test_paths_that_are_not_profiles_are_refused(two_profiles, tmp_path, capsys):
    a, b = two_profiles
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "other.json").write_text(json.dumps({"read_GBps": 20.0}))
    (tmp_path / "future.json").write_text(json.dumps({"version": 99, "kinds": {}}))
    expected = "expected the profile.json that `tacit profile --out DIR` writes, or DIR itself"
    for path, message in [
        (tmp_path / "missing", f"--compare {tmp_path / 'missing'}: no such file; {expected}"),
        (tmp_path / "empty", f"--compare {tmp_path / 'empty'}: no such file; {expected}"),
        (tmp_path / "notes.txt", f"--compare {tmp_path / 'notes.txt'}: {tmp_path / 'notes.txt'} is not JSON"),
        (tmp_path / "other.json", "is not a tacit profile (no 'version' and 'kinds')"),
        (tmp_path / "future.json", "profile version 99; this tacit reads version 1"),
    ]:
        assert main(["profile", "--compare", str(a), str(path)]) == 2
        assert message in capsys.readouterr().err
    # compare.json is not a profile either
    assert main(["profile", "--compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    assert main(["profile", "--compare", str(tmp_path / "cmp" / "compare.json"), str(b)]) == 2
    assert "compare.json is a comparison (`tacit profile --compare`), not a profile" in capsys.readouterr().err
    assert main(["profile", "--compare", str(a), str(b), "--batch-size", "4"]) == 2
    assert "--compare runs nothing: --batch-size describe a run" in capsys.readouterr().err


def test_compare_two_real_profiles(tiny_llama, tmp_path, capsys):
    """Two real `tacit profile` runs of a tiny model: B's late arrival makes mixed steps A lacks."""
    _, _, path = tiny_llama
    workload = tmp_path / "w.json"
    workload.write_text(
        json.dumps([{"input_len": 8, "output_len": 3}, {"input_len": 5, "output_len": 2, "arrival_step": 1}])
    )
    run = ["profile", "--model", str(path), "--block-size", "4", "--no-measure-hw", "--predict-hardware", "none"]
    run += ["--repeats", "1"]
    assert main(run + ["--batch-size", "1", "--input-len", "8", "--output-len", "3", "--out", str(tmp_path / "a")]) == 0
    assert main(run + ["--workload", str(workload), "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["profile", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out and "note: workload: A 1 requests (8 -> 3) x 1 passes" in out
    cmp = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert cmp["kinds"]["mixed"]["a_steps"] == 0 and cmp["kinds"]["mixed"]["b_steps"] > 0
    a = json.loads((tmp_path / "a" / "profile.json").read_text())
    assert a["device"] and a["device"] == cmp["b"]["device"]
    for kind in ("prefill", "decode"):
        k = cmp["kinds"][kind]
        assert k["total"]["a_s"] == pytest.approx(a["kinds"][kind]["step_s"]["mean"], rel=0.03)
        assert k["rows"] and k["total"]["ratio"] > 0
    assert (tmp_path / "c" / "report.html").read_text().count("<svg") == 3
