"""`tacit bench comm`'s plumbing (not its speed): sizes parsed, both communicators timed on every
cell, the JSON's rows and verdict lines."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tacit.bench.comm import format_size, parse_size, verdicts
from tacit.distributed.shm_kernels import load_shm_kernels


def test_sizes_parse_and_print_in_binary_units():
    assert [parse_size(s) for s in ("4KB", "16kb", "1MB", "512", "0.5KB")] == [4096, 16384, 1 << 20, 512, 512]
    assert [format_size(n) for n in (4096, 1 << 20, 32 << 20, 100)] == ["4KB", "1MB", "32MB", "100B"]


def test_verdicts_judge_the_issue_targets():
    rows = [
        {"collective": "all_reduce", "size": "16KB", "bytes": 16 << 10, "shm_us": 12.0, "speedup": 20.0},
        {"collective": "all_reduce", "size": "64KB", "bytes": 64 << 10, "shm_us": 30.0, "speedup": 9.0},
        {"collective": "all_reduce", "size": "1MB", "bytes": 1 << 20, "shm_us": 300.0, "speedup": 5.0},
    ]
    lines = verdicts(rows)
    assert lines[0].startswith("FAIL") and "5.0x at 1MB" in lines[0] and "over 2 sizes" in lines[0]
    assert lines[1].startswith("PASS") and "12.0 us" in lines[1]
    assert all(line.startswith("not measured") for line in verdicts(rows[2:][:0]))


@pytest.mark.skipif(load_shm_kernels() is None, reason="the shm communicator's C++ did not build")
def test_bench_comm_cli_writes_every_cell(tmp_path):
    out, png = tmp_path / "comm.json", tmp_path / "comm.png"
    plot_args = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tacit.cli",
            "bench",
            "comm",
            "--sizes",
            "4KB,64KB",
            "--dtype",
            "float32",
            "--collectives",
            "all_reduce,all_to_all",
            "--repeats",
            "1",
            "--json",
            str(out),
            *plot_args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert not plot_args or png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["dtype"] == "float32"
    assert [(row["collective"], row["size"]) for row in data["rows"]] == [
        ("all_reduce", "4KB"),
        ("all_reduce", "64KB"),
        ("all_to_all", "4KB"),
        ("all_to_all", "64KB"),
    ]
    for row in data["rows"]:
        assert row["gloo_us"] > 0 and row["shm_us"] > 0 and row["speedup"] == row["gloo_us"] / row["shm_us"]
    assert len(data["verdicts"]) == 2 and "all_reduce" in r.stdout and "speedup" in r.stdout


def test_bench_comm_plot_draws_every_communicator_and_collective(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from tacit.bench import plot
    from tacit.bench.cli_machine import plot_comm
    from tacit.cli import build_parser

    args = build_parser().parse_args(["bench", "comm", "--plot", str(tmp_path / "a.png")])
    assert args.plot == str(tmp_path / "a.png") and args.func.__name__ == "cmd_comm"
    rows = [
        {"collective": c, "size": format_size(b), "bytes": b, "gloo_us": g, "shm_us": g / 10, "speedup": 10.0}
        for c in ("all_reduce", "all_gather")
        for b, g in ((4 << 10, 150.0), (1 << 20, 2000.0), (32 << 20, 60000.0))
    ]
    drawn = []
    real = plot.plot_lines
    monkeypatch.setattr(plot, "plot_lines", lambda series, *a, **k: (drawn.append(series), real(series, *a, **k)))
    path = tmp_path / "comm.png"
    plot_comm(rows, "2 ranks, bfloat16", str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"
    lines = {s["engine"] for s in drawn[0]}
    assert lines == {"shm all_reduce", "gloo all_reduce", "shm all_gather", "gloo all_gather"}
    assert [s["time_us"] for s in drawn[0] if s["engine"] == "gloo all_gather"] == [150.0, 2000.0, 60000.0]


def test_bench_comm_refuses_an_unknown_collective():
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "comm", "--collectives", "all_reduce,broadcast"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "broadcast" in r.stderr and "valid: all_reduce" in r.stderr
