"""The rank check's rounds and summary (tune/run.py): counterbalanced order, the mean ranked,
the rounds' agreement reported beside it."""

from __future__ import annotations

import pytest

from tacit.tune.run import measure_rounds, rank_summary


def test_rounds_reverse_the_order_every_other_round():
    seen = []

    def run(point):
        seen.append(point["i"])
        return float(point["i"]), None, ""

    out = measure_rounds([{"i": i} for i in range(4)], run, 3)
    assert seen == [0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3]
    assert out == [[(float(i), "") for i in range(4)]] * 3


def test_a_drift_through_the_run_weighs_on_every_point_alike():
    """Measured values that slow by 10% a trial: forward then reversed, each point's sum of
    trial indices is the same, so a linear drift cannot reorder equal configurations."""
    clock = iter(range(100))

    def run(point):
        return 1.0 - 0.1 * next(clock), None, ""

    out = measure_rounds([{}] * 5, run, 2)
    means = [(out[0][i][0] + out[1][i][0]) / 2 for i in range(5)]
    assert max(means) - min(means) == pytest.approx(0.0, abs=1e-12)


def test_summary_ranks_the_mean_and_reports_the_rounds_agreement():
    predicted = [1.0, 2.0, 3.0, 4.0, float("-inf")]
    rounds = [
        [(0.1, ""), (0.3, ""), (0.2, ""), (0.4, ""), (0.9, "")],
        [(0.1, ""), (0.2, ""), (0.4, ""), (0.5, ""), (0.9, "")],
    ]
    out = rank_summary(predicted, rounds)
    # the last point's prediction is infeasible: left out of every rho
    assert out["configurations"] == 4
    assert out["spearman_each_round"] == [pytest.approx(0.8), pytest.approx(1.0)]
    assert out["spearman"] == pytest.approx(1.0)  # means 0.1, 0.25, 0.3, 0.45
    assert out["repeatability"] == pytest.approx(0.8)
    # a configuration a round failed to measure is left out, not counted as zero
    rounds[1][1] = (None, "out of memory")
    assert rank_summary(predicted, rounds)["configurations"] == 3
