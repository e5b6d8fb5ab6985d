"""The draft length controller: a draft is verified when its expected worth (its acceptance to
the power of its place) beats what the step cost model says a draft row costs against the
step's tokens a second; a request turned down is probed now and then; the config's lower bound
holds."""

from __future__ import annotations

import pytest

from tacit.sampling_params import SamplingParams
from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.request import Request
from tacit.scheduling.spec_controller import PROBE_EVERY, DraftLengthController


def _request() -> Request:
    return Request("r", [1, 2, 3], SamplingParams(max_tokens=8), 8)


def _costs(base: float, per_decode: float, per_draft: float) -> StepCostModel:
    """A cost model fed steps that cost exactly base + per_decode * decodes + per_draft * drafts."""
    cost = StepCostModel()
    for decodes, drafts in [(1, 0), (4, 0), (1, 4), (8, 8), (16, 0), (2, 6)] * 5:
        cost.observe(0, decodes, base + per_decode * decodes + per_draft * drafts, drafts)
    return cost


def test_a_cost_model_that_has_seen_no_draft_verifies_every_draft():
    c = DraftLengthController(StepCostModel())
    c.begin_step(16)
    assert c.threshold == 0 and c.draft_length(_request(), 4) == 4


def test_cheap_drafts_at_batch_one_pay_and_dear_ones_at_batch_sixteen_do_not():
    cost = _costs(0.010, 0.001, 0.0005)
    assert cost.draft_s_per_token == pytest.approx(0.0005, rel=1e-3)
    c = DraftLengthController(cost)
    req = _request()
    c.observe(req, 4, 2)  # accepted 2 then a rejection: 2 in 3 trials, (2 + 1) / (3 + 2) = 0.6
    assert c.acceptance(req) == pytest.approx(0.6)
    c.begin_step(1)  # bar: 0.5 ms * 1 / 11 ms = 0.045; 0.6^5 = 0.078 would still pay
    assert c.threshold == pytest.approx(0.0005 / 0.011)
    assert c.draft_length(req, 4) == 4
    c.begin_step(16)  # bar: 0.5 ms * 16 / 26 ms = 0.31: 0.6 and 0.36 pay, 0.216 does not
    assert c.draft_length(req, 4) == 2


def test_a_request_whose_drafts_are_turned_down_is_probed_every_few_steps():
    c = DraftLengthController(_costs(0.010, 0.001, 0.005))
    req = _request()
    for _ in range(3):
        c.observe(req, 4, 0)  # every first draft rejected: acceptance (0 + 1) / (~2.3 + 2)
    c.begin_step(4)  # bar: 5 ms * 4 / 14 ms = 1.4: nothing pays
    lengths = [c.draft_length(req, 4) for _ in range(2 * PROBE_EVERY)]
    assert lengths == ([0] * (PROBE_EVERY - 1) + [1]) * 2


def test_the_lower_bound_is_verified_whatever_it_costs():
    c = DraftLengthController(_costs(0.010, 0.001, 0.005), min_tokens=2)
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
