"""SamplingParams refuses what would poison the engine: non-finite numbers, booleans posing as
numbers, and integers past what the sampler or the length predictor can hold."""

import math

import pytest

from tacit import LLM, SamplingParams
from tacit.sampling_params import MAX_N
from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.length_predictor import OutputLengthPredictor


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", True),
        ("top_p", math.nan),
        ("min_p", math.nan),
        ("presence_penalty", math.nan),
        ("frequency_penalty", -math.inf),
        ("repetition_penalty", 0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", math.nan),
        ("repetition_penalty", math.inf),
        ("repetition_penalty", True),
        ("repetition_penalty", "1.2"),
        ("ttft_slo_ms", math.inf),
        ("tpot_slo_ms", math.nan),
        ("expected_output_tokens", 10**400),
        ("seed", 2**64),
        ("seed", -(2**64)),
        ("seed", True),
        ("n", MAX_N + 1),
        ("n", 100000),
        ("max_tokens", True),
        ("logprobs", True),
    ],
)
def test_bad_numbers_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=.* is invalid"):
        SamplingParams(**{field: value})


def test_the_edges_still_pass():
    SamplingParams(temperature=1e308, seed=2**63 - 1, n=1)
    SamplingParams(seed=-(2**63), n=MAX_N, expected_output_tokens=2**31 - 1)
    SamplingParams(repetition_penalty=1e-6)  # any positive penalty, < 1 favouring repeats, as vLLM
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**63 - 1, n=2)  # the second sequence's seed would overflow


def test_online_learners_ignore_non_finite_samples():
    p = OutputLengthPredictor()
    for n in (10, 20, 40, 80):
        p.observe(n, 512, 0.7, None, 512, n)
    before = p.predict(30, 512, 0.7)
    p.observe(30, 512, math.nan, None, 512, 30)  # ignored, not learned as NaN
    assert p.predict(30, 512, 0.7) == before and p.num_scored == 4
    # A finite but huge temperature is clipped as a feature: predictions stay finite.
    p.observe(30, 512, 1e308, None, 512, 30)
    assert 1 <= p.predict(30, 512, 1e308) <= 512 and 1 <= p.predict(30, 512, 0.7) <= 512
    cost = StepCostModel()
    cost.observe(100, 4, 0.1)
    cost.observe(100, 4, math.nan)
    cost.observe(100, 4, math.inf)
    assert cost.num_observed == 1 and math.isfinite(cost.step_s(100, 4))


def test_a_huge_temperature_does_not_change_later_requests(tiny_llama):
    llm = LLM(str(tiny_llama[2]), dtype="float32", scheduling_policy="sjf")
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    before = llm.generate(["hello"], greedy)[0].outputs[0].token_ids
    llm.generate(["hello"], SamplingParams(temperature=1e308, max_tokens=6, ignore_eos=True, seed=1))
    assert llm.generate(["hello"], greedy)[0].outputs[0].token_ids == before
    stats = llm.engine.get_stats()
    assert stats.length_predictor_scored == 3 and math.isfinite(stats.length_predictor_mae)
