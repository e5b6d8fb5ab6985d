"""`tacit bench serve --request-rate 2,inf`: the same workload at each rate in turn against a real
tiny `tacit serve`, latency percentiles per rate (the knee), and the rates checked up front."""

import json
import subprocess
import sys

import pytest
from tiny_server import tiny_server

from tacit.bench.cli_serve import parse_rates


def test_rates_parse_and_bad_ones_are_named():
    assert parse_rates("1,2.5,inf") == [1.0, 2.5, float("inf")]
    for bad in ("0", "-1", "fast", "1,,2"):
        with pytest.raises(ValueError, match="--request-rate"):
            parse_rates(bad)


def test_bench_serve_sweeps_request_rates_in_one_run(tiny_llama, tmp_path):
    with tiny_server(tiny_llama[2]) as (url, env):
        out = tmp_path / "rates.json"
        r = subprocess.run(
            [sys.executable, "-m", "tacit.cli", "bench", "serve", "--url", url, "--num-prompts", "6"]
            + ["--input-len", "8", "--output-len", "6", "--dist", "fixed", "--request-rate", "20,inf"]
            + ["--json", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 0, r.stderr + r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [x["request_rate"] for x in rows] == [20.0, float("inf")]
    assert all(x["completed"] == 6 and not x["failed"] and x["e2e_p99_ms"] >= x["e2e_p50_ms"] > 0 for x in rows)
    assert "ttft_p99_ms" in r.stdout


def test_latency_against_rate_is_drawn(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import argparse

    from tacit.bench.cli_serve import _latency_against_rate

    def run(p50: float) -> dict:
        pct = {"p50": p50, "p99": 2 * p50}
        return {"completed": 4, "failed": 0, "request_throughput": 1.0, "output_tok_s": 10.0}, pct

    runs = []
    for p50 in (100.0, 400.0):
        base, pct = run(p50)
        runs.append({**base, "ttft_ms": pct, "tpot_ms": pct, "e2e_ms": pct})
    plot = tmp_path / "knee.png"
    args = argparse.Namespace(json=None, plot=str(plot))
    assert _latency_against_rate(args, [2.0, float("inf")], runs, "m") == 0
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert "e2e_p99_ms" in capsys.readouterr().out


def test_plot_without_matplotlib_is_refused_before_the_benchmark_runs(no_matplotlib):
    from tacit.bench import plot

    with pytest.raises(ValueError, match=r"--plot needs matplotlib: pip install -e '\.\[bench\]'"):
        plot.require_plotting("out.png")
    plot.require_plotting(None)  # no --plot: nothing needed


@pytest.mark.parametrize(
    "args",
    [["--scenario", "multi-turn"], ["--scenario", "restart"], ["--structured-fraction", "0,0.5"]],
    ids=["multi-turn", "restart", "structured-list"],
)
def test_plot_is_refused_where_nothing_would_draw_it(args):
    """--plot on a run that draws nothing is refused, not silently ignored."""
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "serve", *args, "--plot", "x.png"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "--plot draws one run, a --request-rate list or --scenario mixed-priority" in r.stderr
