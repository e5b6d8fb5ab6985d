"""tune.objective: goodput counts each request against its own class's SLO, a failed request
never meets, and the confidence numbers behave as intervals should."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tacit.bench.serve import parse_slo
from tacit.tune.objective import SLO, RequestOutcome, bootstrap_ratio, score, spread


def outcome(priority: int, ttft: float, e2e: float, tokens: int = 11, ok: bool = True) -> RequestOutcome:
    return RequestOutcome(priority=priority, ok=ok, ttft=ttft, e2e=e2e, output_tokens=tokens)


def test_slo_parse_takes_both_separators_in_milliseconds():
    assert SLO.parse("ttft=500,tpot=100") == SLO(default={"ttft": 0.5, "tpot": 0.1})
    assert SLO.parse("ttft:500,e2e=2000").default == {"ttft": 0.5, "e2e": 2.0}
    # bench serve's --slo is the same parser: one implementation, both spellings.
    assert parse_slo("ttft=500,tpot=50") == parse_slo("ttft:500,tpot:50") == {"ttft": 0.5, "tpot": 0.05}
    for bad in ("latency=5", "ttft=", "ttft=-3", "ttft=fast"):
        with pytest.raises(ValueError, match="--slo part .* is invalid"):
            SLO.parse(bad)


def test_slo_classes_fall_back_to_default_and_refuse_bad_bounds():
    slo = SLO(classes={0: {"ttft": 0.2}}, default={"ttft": 1.0})
    assert slo.for_priority(0) == {"ttft": 0.2}
    assert slo.for_priority(7) == {"ttft": 1.0}
    with pytest.raises(ValueError, match="key 'latency' is not known; valid: ttft, tpot, e2e"):
        SLO(classes={0: {"latency": 1.0}})
    with pytest.raises(ValueError, match=r"classes\[1\]\['ttft'\]=0 is invalid"):
        SLO(classes={1: {"ttft": 0}})
    with pytest.raises(ValueError, match="must be an integer priority"):
        SLO(classes={"high": {"ttft": 1.0}})


def test_tpot_is_bench_serves():
    assert outcome(0, 0.1, 1.1, tokens=11).tpot == pytest.approx(0.1)
    assert outcome(0, 0.1, 0.1, tokens=1).tpot is None


def test_goodput_counts_each_request_against_its_own_class():
    slo = SLO(classes={0: {"ttft": 0.2}}, default={"ttft": 1.0, "tpot": 0.05})
    outcomes = [
        outcome(0, 0.1, 0.6),  # interactive, fast: meets
        outcome(0, 0.5, 1.0),  # interactive, 500 ms first token: misses the 200 ms bound
        outcome(1, 0.5, 0.9),  # batch, 500 ms: meets 1 s; TPOT 40 ms meets 50 ms
        outcome(1, 0.5, 1.5),  # batch: TPOT 100 ms misses
        outcome(2, 0.0, 0.0, tokens=0, ok=False),  # failed: never meets, even with zero latencies
    ]
    s = score(outcomes, slo, duration_s=2.0)
    assert s["goodput_req_s"] == pytest.approx(2 / 2.0)
    assert s["throughput_req_s"] == pytest.approx(4 / 2.0)
    assert s["output_tok_s"] == pytest.approx(44 / 2.0)
    assert s["completed"] == 4 and s["failed"] == 1
    assert s["slo_attainment"] == pytest.approx(2 / 5)
    # The same requests under one class-free SLO: the 500 ms interactive one now meets.
    assert score(outcomes, SLO(default={"ttft": 1.0}), 2.0)["goodput_req_s"] == pytest.approx(4 / 2.0)
    # No bounds at all: every completed request counts, the failed one still does not.
    assert score(outcomes, SLO(), 2.0)["goodput_req_s"] == pytest.approx(4 / 2.0)


def test_percentiles_are_numpys_over_completed_requests():
    ttfts = [0.01 * i for i in range(1, 101)]
    outcomes = [outcome(0, t, t + 1.0) for t in ttfts] + [outcome(0, 0, 0, tokens=0, ok=False)] * 3
    s = score(outcomes, SLO(), duration_s=10.0)
    assert s["p99_ttft_s"] == pytest.approx(float(np.percentile(ttfts, 99)))
    assert s["p50_ttft_s"] == pytest.approx(float(np.percentile(ttfts, 50)))
    assert s["p99_tpot_s"] == pytest.approx(0.1)
    none_ok = score([outcome(0, 0, 0, tokens=0, ok=False)], SLO(), 1.0)
    assert math.isnan(none_ok["p99_ttft_s"]) and none_ok["goodput_req_s"] == 0.0


def test_score_refuses_what_it_cannot_rate():
    with pytest.raises(ValueError, match="at least one request outcome"):
        score([], SLO(), 1.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="duration_s=.* is invalid"):
            score([outcome(0, 0.1, 0.2)], SLO(), bad)


def test_bootstrap_ratio_brackets_the_ratio_of_means_and_narrows_with_repeats():
    rng = np.random.default_rng(1)
    a = list(12.0 + rng.normal(0, 1.0, 10))
    b = list(10.0 + rng.normal(0, 1.0, 10))
    med, low, high = bootstrap_ratio(a, b)
    assert low < np.mean(a) / np.mean(b) < high
    assert low < med < high
    assert 1.0 < low  # 20% apart with 10% noise over ten repeats: clearly better
    assert bootstrap_ratio(a, b) == (med, low, high)  # seeded
    many = bootstrap_ratio(list(12.0 + rng.normal(0, 1.0, 200)), list(10.0 + rng.normal(0, 1.0, 200)))
    assert many[2] - many[1] < (high - low) / 2
    assert bootstrap_ratio([2.0, 2.0], [1.0, 1.0]) == (2.0, 2.0, 2.0)  # no spread, no interval
    with pytest.raises(ValueError, match="b must be a list of at least 1 finite numbers"):
        bootstrap_ratio([1.0], [])
    with pytest.raises(ValueError, match="n=0 is invalid"):
        bootstrap_ratio([1.0], [1.0], n=0)


def test_spread_is_sample_std_and_iqr():
    std, iqr = spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert std == pytest.approx(float(np.std([1, 2, 3, 4, 5], ddof=1)))
    assert iqr == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least 2 finite numbers"):
        spread([1.0])
