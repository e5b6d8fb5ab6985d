"""StepCostModel's estimate of a decode step without drafts: as measured at a batch size where
one was, since the linear fit's intercept misses it once most steps verify drafts."""

from __future__ import annotations

import pytest

from tacit.scheduling.cost_model import StepCostModel


def test_a_plain_decode_step_is_priced_as_measured_not_as_the_fit_says():
    """Once most steps verify drafts the fit's intercept misses the plain step (a second row
    costs more than a third): steps of 1, 2 and 3 rows measured 3.8, 6.3 and 7.0 ms."""
    cost = StepCostModel()
    for _ in range(3):
        cost.observe(0, 1, 0.0038)
    for _ in range(30):
        cost.observe(0, 1, 0.0063, 1)
        cost.observe(0, 1, 0.0070, 2)
    assert cost.step_s(0, 1) > 0.005  # the fit
    assert cost.decode_step_s(1) == pytest.approx(0.0038)  # as measured
    assert cost.decode_step_s(4) == pytest.approx(cost.step_s(0, 4))  # never measured: the fit
