"""The draft length controller: a draft is verified when its expected worth (its acceptance to
the power of its place) beats what the step cost model says a decode row costs against the
step's tokens a second; until a step with drafts has been measured every draft is verified; a
request turned down is probed now and then; the config's lower bound holds."""

from __future__ import annotations

import pytest

from tacit.sampling_params import SamplingParams
from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.request import Request
from tacit.scheduling.spec_controller import PROBE_EVERY, DraftLengthController


def _request() -> Request:
    return Request("r", [1, 2, 3], SamplingParams(max_tokens=8), 8)


def _costs(base: float, per_row: float) -> StepCostModel:
    """A cost model fed steps that cost exactly base + per_row * (decodes + drafts)."""
    cost = StepCostModel()
    for decodes, drafts in [(1, 0), (4, 0), (1, 3), (8, 8), (16, 0), (2, 6)] * 5:
        cost.observe(0, decodes, base + per_row * (decodes + drafts), drafts)
    return cost


def test_until_a_step_with_drafts_is_measured_every_draft_is_verified():
    cost = StepCostModel()
    for _ in range(20):
        cost.observe(0, 1, 0.005)  # batch-1 steps: base and row cost cannot be told apart yet
    c = DraftLengthController(cost)
    c.begin_step(1)
    assert c.threshold == 0 and c.draft_length(_request(), 4) == 4
    cost.observe(0, 1, 0.007, 2)
    c.begin_step(1)
    assert c.threshold > 0


def test_drafts_pay_at_batch_one_and_not_at_batch_sixteen():
    cost = _costs(0.0035, 0.0014)  # the default model's rows: ~4.9 ms at batch 1
    assert cost.draft_s_per_token == pytest.approx(0.0014, rel=1e-3)
    c = DraftLengthController(cost)
    req = _request()
    c.observe(req, 4, 2)  # accepted 2 then a rejection: 2 in 3 trials, (2 + 1) / (3 + 2) = 0.6
    assert c.acceptance(req) == pytest.approx(0.6)
    c.begin_step(1)  # bar: 1.4 ms * 1 / 4.9 ms = 0.29: 0.6 and 0.36 pay, 0.216 does not
    assert c.threshold == pytest.approx(0.0014 / 0.0049)
    assert c.draft_length(req, 4) == 2
    c.begin_step(16)  # bar: 1.4 ms * 16 / 25.9 ms = 0.86: nothing pays
    assert c.draft_length(req, 4) == 0


def test_a_request_whose_drafts_are_turned_down_is_probed_every_few_steps():
    c = DraftLengthController(_costs(0.010, 0.005))
    req = _request()
    for _ in range(3):
        c.observe(req, 4, 0)  # every first draft rejected: acceptance (0 + 1) / (~2.3 + 2)
    c.begin_step(4)  # bar: 5 ms * 4 / 30 ms = 0.67: nothing pays
    lengths = [c.draft_length(req, 4) for _ in range(2 * PROBE_EVERY)]
    assert lengths == ([0] * (PROBE_EVERY - 1) + [1]) * 2


def test_the_lower_bound_is_verified_whatever_it_costs():
    c = DraftLengthController(_costs(0.010, 0.005), min_tokens=2)
    req = _request()
    c.observe(req, 4, 0)
    c.begin_step(4)
    assert c.draft_length(req, 4) == 2 and c.draft_length(req, 1) == 1 and c.draft_length(req, 0) == 0


def test_acceptance_follows_the_text_as_it_changes():
    c = DraftLengthController(StepCostModel())
    req = _request()
    for _ in range(6):
        c.observe(req, 4, 4)
    high = c.acceptance(req)
    for _ in range(6):
        c.observe(req, 4, 0)
    assert high > 0.85 and c.acceptance(req) < 0.35


def test_a_bar_no_estimate_can_clear_stops_proposing_and_probing():
    from tacit.scheduling.spec_controller import max_acceptance

    c = DraftLengthController(_costs(0.0035, 0.0014), max_tokens=4)
    req = _request()
    for _ in range(10):
        c.observe(req, 4, 4)  # every draft kept: the estimate at its ceiling
    assert c.acceptance(req) == pytest.approx(max_acceptance(4), abs=0.01) and c.ceiling == max_acceptance(4)
    c.cost = _costs(0.0035, 0.0020)
    c.begin_step(16)  # bar 2.0 ms * 16 / 35.5 ms = 0.90 > 0.87
    assert not c.worth_proposing
    assert [c.draft_length(req, 4) for _ in range(2 * PROBE_EVERY)] == [0] * (2 * PROBE_EVERY)
    c.begin_step(1)
    assert c.worth_proposing and c.draft_length(req, 4) == 4
    assert DraftLengthController(_costs(0.0035, 0.0014), min_tokens=1).worth_proposing


def test_a_costly_proposer_raises_the_bar_and_stops_running_until_measured_again():
    """A draft model as costly as the target (the default model drafting for itself: ~4 ms a
    proposed token against a 4.9 ms step) never pays; a cheap proposer barely moves the bar."""
    c = DraftLengthController(_costs(0.0035, 0.0014))
    c.observe_proposer(0.0001, 3)  # prompt lookup: ~0.1 ms a call
    c.begin_step(1)
    assert c.threshold == pytest.approx((0.0014 + 0.0001 / 3) / 0.0049)
    assert c.propose_after_step()
    for _ in range(20):
        c.observe_proposer(0.012, 3)
    c.begin_step(1)
    assert c.threshold > c.ceiling and not c.worth_proposing
    assert not any(c.propose_after_step() for _ in range(100))  # the bar only rises with the batch
    c.begin_step(4)
    c.observe_proposer(0.036, 12)  # measured at 4 decodes: 3 ms a token
    c.begin_step(4)
    assert not c.propose_after_step()
    c.begin_step(2)  # a smaller batch than measured at: run it to measure again
    assert c.propose_after_step()
