"""Serving at a request rate (open_loop.py): Poisson arrivals, the concurrency that follows, the
served TPOT and the TTFT with its wait; `tacit predict --request-rate`."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.open_loop import SaturatedError, solve_open_loop
from tacit.perf_model.operators import Parallel
from tacit.perf_model.predict import Workload, predict
from tacit.platforms.hardware_table import get_hardware_spec
from tests.perf_model.test_counts import DENSE, MOE


def test_a_flat_decode_step_solves_by_hand():
    """tpot flat at t: u = R P, X = t / (1 - u), n = R (out - 1) X, and the wait is the M/D/1
    queue's u P / (2 (1 - u)) plus half a step for the share (1 - u)(1 - e^-n) of the time the
    device decodes."""
    t, p, rate, out = 0.006, 0.012, 2.0, 256
    loop = solve_open_loop(rate, p, out, lambda n: t)
    u = rate * p
    x = t / (1 - u)
    n = rate * (out - 1) * x
    assert loop.prefill_share == pytest.approx(u) and loop.served_tpot_s == pytest.approx(x, rel=1e-12)
    assert loop.decoding == pytest.approx(n, rel=1e-9)
    wait = u * p / (2 * (1 - u)) + (1 - u) * (1 - math.exp(-n)) * t / 2
    assert loop.wait_s == pytest.approx(wait, rel=1e-9)
    assert loop.served_ttft_s == pytest.approx(p + wait, rel=1e-12)
    # Little's law over a request's whole life
    assert loop.in_flight == pytest.approx(rate * (loop.served_ttft_s + (out - 1) * x), rel=1e-9)


def test_a_step_growing_with_the_batch_settles_where_little_and_the_step_agree():
    a, b, rate, out, p = 0.005, 0.0001, 8.0, 200, 0.02
    loop = solve_open_loop(rate, p, out, lambda n: a + b * n)
    # between whole n the step is interpolated; at the fixed point n = R (out - 1) tpot(n) / (1 - u)
    n, u = loop.decoding, rate * p
    lo = math.floor(n)
    step = (a + b * lo) + b * (n - lo)
    assert n == pytest.approx(rate * (out - 1) * step / (1 - u), rel=1e-6)
    assert loop.served_tpot_s == pytest.approx(step / (1 - u), rel=1e-9)


def test_more_load_waits_longer_and_decodes_slower():
    def loop(rate):
        return solve_open_loop(rate, 0.012, 256, lambda n: 0.006 + 0.00005 * n)

    slow, fast = loop(1.0), loop(20.0)
    assert fast.served_ttft_s > slow.served_ttft_s and fast.served_tpot_s > slow.served_tpot_s
    assert fast.decoding > slow.decoding
    # and next to nothing arrives: the prompt alone, the one-sequence step
    idle = loop(1e-6)
    assert idle.served_ttft_s == pytest.approx(0.012, rel=1e-4)
    assert idle.served_tpot_s == pytest.approx(0.00605, rel=1e-4)


def test_attention_groups_split_the_prompts():
    one = solve_open_loop(10.0, 0.05, 100, lambda n: 0.01, groups=1)
    four = solve_open_loop(10.0, 0.05, 100, lambda n: 0.01, groups=4)
    assert one.prefill_share == pytest.approx(0.5)
    assert four.prefill_share == pytest.approx(1 - (1 - 0.125) ** 4)
    assert four.wait_s < one.wait_s  # each group's queue sees a quarter of the prompts


def test_a_rate_past_what_is_served_is_refused_by_name():
    with pytest.raises(SaturatedError, match=r"--request-rate 100: .* under 50 requests a second"):
        solve_open_loop(100.0, 0.02, 64, lambda n: 0.01)
    # every sequence more slows the step enough that more pile up: no steady state
    with pytest.raises(SaturatedError, match="grow past 4096"):
        solve_open_loop(50.0, 0.001, 512, lambda n: 0.01 + 0.001 * n, max_sequences=4096)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="positive finite"):
            solve_open_loop(bad, 0.01, 64, lambda n: 0.01)


@pytest.mark.parametrize("cfg,par", [(DENSE, Parallel(tp=2)), (MOE, Parallel(tp=1, dp=4, ep=True))], ids=["tp", "dp"])
def test_predict_prices_the_rate_with_its_own_steps(cfg, par):
    shape, spec = shape_from_hf(cfg), get_hardware_spec("h100-sxm")
    w = Workload(1, 1024, 256, parallel=par, request_rate=4.0)
    pred = predict(shape, spec, w)
    loop = pred.open_loop
    alone = predict(shape, spec, replace(w, request_rate=None))
    assert loop.prefill_one_s == pytest.approx(alone.ttft_s, rel=1e-12)
    replicas = pred.layout.replicas
    assert loop.request_rate == pytest.approx(4.0 / replicas)
    # the decode step is priced at the sequences the rate keeps decoding, rounded up
    at = predict(shape, spec, replace(w, request_rate=None, batch=max(1, math.ceil(loop.decoding)) * replicas))
    assert pred.tpot_s == pytest.approx(at.tpot_s, rel=1e-12)
    assert pred.ttft_s == pytest.approx(loop.served_ttft_s) and pred.served_tpot_s == loop.served_tpot_s
    assert pred.throughput_tok_s == pytest.approx(4.0 * 256) == pred.served_throughput_tok_s
    js = pred.as_json()
    assert js["served_ttft_ms"] == pytest.approx(1e3 * loop.served_ttft_s)
    assert js["open_loop"]["decoding_sequences"] == loop.decoding
    assert alone.as_json()["served_ttft_ms"] is None and alone.as_json()["open_loop"] is None


def test_a_workload_refuses_a_rate_without_a_prompt_or_with_a_fixed_context():
    with pytest.raises(ValueError, match="request_rate"):
        Workload(1, 0, 64, context=512, request_rate=1.0)
    with pytest.raises(ValueError, match="request_rate"):
        Workload(1, 128, 64, context=512, request_rate=1.0)
    with pytest.raises(ValueError, match="request_rate"):
        Workload(1, 128, 64, request_rate=-2.0)


def _argv(*extra: str) -> list[str]:
    return ["predict", "--model", "random:qwen3-100m", "--hardware", "h100-sxm", *extra]


def test_the_cli_prints_and_writes_it(tmp_path, capsys):
    from tacit.cli import main

    out = tmp_path / "p.json"
    assert main(_argv("--request-rate", "3", "--json", str(out))) == 0
    data = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "3 requests/s (Poisson)" in printed
    assert f"TTFT        {data['served_ttft_ms']:.2f} ms mean at 3 requests/s" in printed
    assert f"served TPOT {data['served_tpot_ms']:.3f} ms with requests arriving at --request-rate 3" in printed
    assert data["open_loop"]["request_rate"] == 3 and data["throughput_tok_s"] == pytest.approx(3 * 128)
    assert data["workload"]["request_rate"] == 3 and data["workload"]["batch"] is None  # the rate gives it
    assert data["served_ttft_ms"] > data["open_loop"]["prompt_alone_ms"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--request-rate", "2", "--batch-size", "8"], "--batch-size does not go with --request-rate"),
        (["--request-rate", "2", "--input-len", "0", "--context", "64"], "request_rate"),
        (["--request-rate", "1e9"], "--request-rate 1e+09"),
        (["--request-rate", "nan"], "request_rate=nan is invalid"),
        (["--serve", "--workload", "w.jsonl", "--request-rate", "2"], "--request-rate does not go with --serve"),
    ],
)
def test_the_cli_refuses_what_a_rate_cannot_price(extra, message, capsys):
    from tacit.cli import main

    assert main(_argv(*extra)) == 2
    assert message in capsys.readouterr().err


def test_published_refuses_it():
    from tacit.cli import main

    assert main(["predict", "--published", "--request-rate", "2"]) == 2


def test_a_light_load_agrees_with_the_scheduler_replay(tmp_path):
    """Two models of the same serving: the closed form here and `--serve`'s replay of the
    scheduler over the same Poisson arrivals (Llama-3.1-8B on an H100, 467 / 256 tokens, 2
    requests/s). At a light load, where a prompt rarely shares its step with another, they agree
    on the mean TTFT and TPOT (within 10%; they measured 15.6 against 16.3 ms and 6.67 against
    6.58); under load the replay mixes prefill chunks into decode steps, which the closed form
    prices as interruptions."""
    import random

    from tacit.cli import main

    rng, t, lines = random.Random(0), 0.0, []
    for _ in range(200):
        t += rng.expovariate(2.0)
        lines.append(json.dumps({"arrival_s": t, "input_len": 467, "output_len": 256}))
    workload = tmp_path / "w.jsonl"
    workload.write_text("\n".join(lines) + "\n")
    common = ["predict", "--model", "Llama-3.1-8B", "--hardware", "h100-sxm", "--quantization", "bf16"]
    replay, rate = tmp_path / "replay.json", tmp_path / "rate.json"
    assert main([*common, "--serve", "--workload", str(workload), "--json", str(replay)]) == 0
    assert main([*common, "--request-rate", "2", "--input-len", "467", "--output-len", "256", "--json", str(rate)]) == 0
    simulated, closed = json.loads(replay.read_text()), json.loads(rate.read_text())
    assert closed["served_ttft_ms"] == pytest.approx(simulated["ttft_ms"]["mean"], rel=0.1)
    assert closed["served_tpot_ms"] == pytest.approx(simulated["tpot_ms"]["mean"], rel=0.1)
