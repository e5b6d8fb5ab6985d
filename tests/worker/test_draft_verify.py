"""The multi-token step contract end to end: a proposer offers draft tokens, the scheduler
schedules them as tokens to verify, the runner computes them in one forward and keeps the
accepted ones, the scheduler rewinds past the rejected ones. Greedy output must not depend on
what was proposed; only the number of steps may."""

from __future__ import annotations

import pytest
from scripted_drafts import ScriptedProposer

from tacit import LLM, SamplingParams
from tacit.sampling_params import StructuredOutputsParams
from tacit.worker.drafter import DraftProposer

PROMPTS = ["Paris is", [5, 6, 7, 8, 9, 10, 11], "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    llm = LLM(str(tiny_llama[2]), dtype="float32")
    # Every draft offered is verified (speculative_config's min_speculative_tokens at its top):
    # these tests count the steps a scripted proposer's drafts save, not what the controller
    # would choose on this machine's step costs (tests/scheduling/test_spec_controller.py).
    llm.engine.scheduler.spec.min_tokens = 1 << 30
    return llm


def _generate(llm: LLM, params: SamplingParams, drafter: DraftProposer | None):
    runner = llm.engine.runner
    steps = llm.engine.num_steps
    runner.drafter = drafter
    try:
        outs = llm.generate(PROMPTS, params)
    finally:
        runner.drafter = None
    return [o.outputs[0] for o in outs], llm.engine.num_steps - steps


def _reference(llm: LLM, params: SamplingParams):
    outs, steps = _generate(llm, params, None)
    tok = llm.get_tokenizer()
    prompts = [tuple(p) if isinstance(p, list) else tuple(tok.encode(p)) for p in PROMPTS]
    return outs, steps, {p: list(o.token_ids) for p, o in zip(prompts, outs)}


def test_right_drafts_are_all_accepted_and_the_output_is_unchanged(llm):
    params = SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True, logprobs=2)
    base, base_steps, refs = _reference(llm, params)
    proposer = ScriptedProposer(refs, k=3)
    outs, steps = _generate(llm, params, proposer)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert [o.text for o in outs] == [o.text for o in base]
    assert proposer.proposed > 0
    # 17 tokens: the prefill's first, then 4 per verify step (3 drafts + 1): 5 steps, not 17.
    assert steps == base_steps - 12
    for o, b in zip(outs, base):
        assert [sorted(d) for d in o.logprobs] == [sorted(d) for d in b.logprobs]
        for d, e in zip(o.logprobs, b.logprobs):
            for t in d:
                assert d[t].logprob == pytest.approx(e[t].logprob, abs=1e-4)
        assert o.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-3)


@pytest.mark.parametrize(
    "wrong",
    [lambda done, j: True, lambda done, j: j == 1, lambda done, j: (done + j) % 3 == 0],
    ids=["all-wrong", "second-wrong", "scattered"],
)
def test_wrong_drafts_are_rejected_and_the_output_is_unchanged(llm, wrong):
    params = SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True)
    base, base_steps, refs = _reference(llm, params)
    outs, steps = _generate(llm, params, ScriptedProposer(refs, k=4, wrong=wrong))
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert [o.finish_reason for o in outs] == ["length"] * len(PROMPTS)
    assert steps <= base_steps


def test_stops_inside_accepted_drafts_end_the_output_where_one_token_a_step_would(llm):
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    base, _, refs = _reference(llm, params)
    for kw in (
        {"max_tokens": 6},  # 6 = 1 + 4 + 1: the limit falls inside the second verify step
        {"stop_token_ids": [base[0].token_ids[5]]},
        {"stop": [base[2].text[6:9]]},
    ):
        p = SamplingParams(temperature=0.0, ignore_eos=True, **{"max_tokens": 14, **kw})
        want, _ = _generate(llm, p, None)
        got, _ = _generate(llm, p, ScriptedProposer(refs, k=4))
        assert [(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in got] == [
            (o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in want
        ]


@pytest.mark.parametrize(
    "penalties",
    [{"frequency_penalty": 1.5, "presence_penalty": 0.5}, {"repetition_penalty": 1.3}],
    ids=["additive", "repetition"],
)
def test_penalties_see_each_draft_before_it(llm, penalties):
    """Row j of a verify step counts drafts 1..j as generated: penalised greedy output is the
    same as one token a step. 30 tokens in runs of 5 right drafts: rows that missed the drafts
    before them diverged from it for both kinds of penalty (and with 15 tokens, 3 drafts and
    the second wrong, as this test once was, for neither)."""
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, **penalties)
    base, _, refs = _reference(llm, params)
    plain, _ = _generate(llm, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), None)
    assert [o.token_ids for o in base] != [o.token_ids for o in plain]  # the penalty matters here
    for proposer in (ScriptedProposer(refs, k=5), ScriptedProposer(refs, k=3, wrong=lambda done, j: j == 2)):
        outs, _ = _generate(llm, params, proposer)
        assert [o.token_ids for o in outs] == [o.token_ids for o in base]


@pytest.mark.parametrize(
    "wrong",
    [lambda done, j: False, lambda done, j: j == 1, lambda done, j: True],
    ids=["right", "second-wrong", "all-wrong"],
)
def test_structured_output_requests_verify_the_drafts_their_grammar_accepts(llm, wrong):
    """Each verify row is masked as its position would be one token a step (the matcher advanced
    over the drafts before it, then rolled back); drafts past the first the grammar refuses are
    not verified. Output equals one token a step; right drafts save steps."""
    params = SamplingParams(
        temperature=0.0,
        max_tokens=10,
        structured_outputs=StructuredOutputsParams(regex="[a-z ]{3,12}"),
        ignore_eos=True,
    )
    base, base_steps, refs = _reference(llm, params)
    proposer = ScriptedProposer(refs, k=3, wrong=wrong)
    outs, steps = _generate(llm, params, proposer)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert [o.text for o in outs] == [o.text for o in base]
    assert proposer.proposed > 0
    verified = llm.engine.scheduler.num_draft_tokens
    if wrong(0, 0) is False and wrong(0, 1) is False:
        assert steps < base_steps  # right drafts within the grammar: verified and kept
    assert verified > 0 or wrong(0, 0)


def test_the_engine_is_left_as_it_was(llm):
    """After verify steps every block is free again and a request without drafts is unchanged."""
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    base, _, refs = _reference(llm, params)
    _generate(llm, params, ScriptedProposer(refs, k=5, wrong=lambda done, j: j == 3))
    stats = llm.engine.get_stats()
    assert stats.kv_blocks_used == 0 and not llm.engine.runner.requests
    again, _ = _generate(llm, params, None)
    assert [o.token_ids for o in again] == [o.token_ids for o in base]
