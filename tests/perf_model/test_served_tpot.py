"""The served TPOT (served_tpot.py): the batch as a closed loop with its replacements' prompts
prefilled on the same devices, as bench_serving --max-concurrency measures a PD-mixed deployment."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import Parallel
from tacit.perf_model.predict import Workload, predict
from tacit.perf_model.served_tpot import prefill_share, served_throughput, served_tpot
from tacit.platforms.hardware_table import get_hardware_spec
from tests.perf_model.test_counts import DENSE, MOE


def _one_group_by_hand(t: float, p: float, n: int, out: int) -> float:
    """With one attention group u = (n - 1) p / (p + (out - 1) x), and x (1 - u) = t is the
    quadratic (out - 1) x^2 + (p (2 - n) - t (out - 1)) x - t p = 0; its positive root."""
    a, b, c = out - 1, p * (2 - n) - t * (out - 1), -t * p
    return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)


@pytest.mark.parametrize("t,p,n,out", [(0.022, 0.228, 74, 1500), (0.005, 0.05, 8, 256), (0.02, 2.0, 300, 128)])
def test_one_group_solves_the_steady_state_by_hand(t, p, n, out):
    x, u = served_tpot(t, p, n, out)
    assert x == pytest.approx(_one_group_by_hand(t, p, n, out), rel=1e-9)
    assert x * (1 - u) == pytest.approx(t, rel=1e-9)
    assert 0 < u < 1


def test_nothing_interrupts_one_request_one_token_or_no_prompt():
    assert served_tpot(0.01, 0.5, 1, 100) == (0.01, 0.0)
    assert served_tpot(0.01, 0.5, 64, 1) == (0.01, 0.0)
    assert served_tpot(0.01, 0.0, 64, 100) == (0.01, 0.0)


def test_groups_that_prefill_at_once_share_the_step():
    t, p, n, out = 0.025, 0.5, 231, 2048
    one, _ = served_tpot(t, p, n, out, 1)
    xs = [served_tpot(t, p, n, out, d)[0] for d in (1, 2, 4, 16, 64)]
    assert xs[0] == one and all(a > b for a, b in zip(xs, xs[1:])) and xs[-1] > t
    x16, u16 = served_tpot(t, p, n, out, 16)
    # some group prefills 1 - (1 - u_g)^16 of the time, u_g each group's own share
    u_g = (n - 1) * p / (16 * (p + (out - 1) * x16))
    assert u16 == pytest.approx(1 - (1 - u_g) ** 16, rel=1e-12) == prefill_share(x16, p, n, out, 16)
    assert x16 * (1 - u16) == pytest.approx(t, rel=1e-9)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="must be positive"):
        served_tpot(0.0, 0.1, 8, 10)
    with pytest.raises(ValueError, match="must be positive"):
        served_tpot(0.01, 0.1, 8, 10, 0)


@pytest.mark.parametrize("cfg,par", [(DENSE, Parallel(tp=2)), (MOE, Parallel(tp=1, dp=4, ep=True))], ids=["tp", "dp"])
def test_predict_serves_the_batch_with_one_prompt_alone_as_the_interruption(cfg, par):
    shape, spec = shape_from_hf(cfg), get_hardware_spec("h100-sxm")
    w = Workload(32, 1024, 256, parallel=par)
    pred = predict(shape, spec, w)
    alone = predict(shape, spec, replace(w, batch=1))
    x, u = served_tpot(pred.tpot_s, alone.ttft_s, 32, 256, pred.layout.attention_ranks)
    assert pred.served_tpot_s == pytest.approx(x, rel=1e-12) and pred.served_prefill_share == pytest.approx(u)
    assert pred.served_tpot_s > pred.tpot_s
    assert pred.as_json()["served_tpot_ms"] == pytest.approx(1e3 * x)
    # Little's law: 32 requests in flight, 256 tokens each a life of one TTFT and 255 served TPOTs
    assert pred.served_throughput_tok_s == pytest.approx(32 * 256 / (alone.ttft_s + 255 * x), rel=1e-12)
    assert pred.served_throughput_tok_s == served_throughput(32, 256, alone.ttft_s, x)
    no_prompt = predict(shape, spec, replace(w, input_len=0, context=1024))
    assert no_prompt.as_json()["served_tpot_ms"] is None and no_prompt.as_json()["served_throughput_tok_s"] is None
    one = predict(shape, spec, replace(w, batch=1))
    assert one.served_tpot_s == one.tpot_s and one.served_prefill_share == 0.0
    assert one.served_throughput_tok_s == pytest.approx(256 / (one.ttft_s + 255 * one.tpot_s), rel=1e-12)


def test_the_cli_prints_and_writes_it(tmp_path, capsys):
    from tacit.cli import main

    out = tmp_path / "p.json"
    argv = [
        "predict",
        "--model",
        "random:qwen3-100m",
        "--hardware",
        "h100-sxm",
        "--batch-size",
        "16",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["served_tpot_ms"] > data["tpot_ms"] and 0 < data["served_prefill_share"] < 1
    printed = capsys.readouterr().out
    assert f"served TPOT {data['served_tpot_ms']:.3f} ms" in printed and "--max-concurrency 16" in printed
    assert f"{data['served_throughput_tok_s']:.1f} output tok/s" in printed
