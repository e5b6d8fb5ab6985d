"""repetition_penalty as vLLM (and transformers) apply it: every token of the prompt or of the
output so far has its logit divided by the penalty where positive, multiplied where not; it comes
before the presence / frequency penalties, and a row without it is left alone."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from tacit import LLM, SamplingParams
from tacit.layers.sampler import Sampler, SamplingMetadata, apply_penalties
from tacit.scheduling.scheduler_output import SchedulerOutput
from tacit.worker.request_state import CachedRequestState
from tacit.worker.sample_step import sampling_metadata

VOCAB = 64
# Row 0 repeats ids across prompt and output; row 1's penalty < 1 favours repeats; row 2 has none.
PROMPTS = [[5, 6, 7, 5, 63], [1], [10, 20]]
OUTPUTS = [[7, 8, 9, 9], [2, 3, 1], [10]]
PENALTIES = [1.3, 0.7, 1.0]


def _logits(rows: int) -> torch.Tensor:
    # Both signs, so both branches (divide, multiply) are taken on seen tokens.
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 4


def _metadata(params: list[SamplingParams]) -> SamplingMetadata:
    return SamplingMetadata(params, OUTPUTS, [None] * len(params), prompt_token_ids=PROMPTS)


def test_logits_equal_transformers_processor():
    logits = _logits(3)
    got = apply_penalties(logits.clone(), _metadata([SamplingParams(repetition_penalty=r) for r in PENALTIES]))
    for row, r in enumerate(PENALTIES):
        ids = torch.tensor([PROMPTS[row] + OUTPUTS[row]])
        want = RepetitionPenaltyLogitsProcessor(r)(ids, logits[row : row + 1].clone())[0]
        assert torch.equal(got[row], want), row
    assert torch.equal(got[2], logits[2])  # penalty 1.0: untouched
    seen = PROMPTS[0] + OUTPUTS[0]
    assert not torch.equal(got[0, seen], logits[0, seen])  # the check above has something to check
    assert torch.equal(got[0, 0], logits[0, 0])  # an unseen token is untouched


def test_repetition_then_frequency_and_presence_as_vllm():
    logits = _logits(3)
    params = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25)] * 3
    got = apply_penalties(logits.clone(), _metadata(params))
    for row in range(3):
        ids = torch.tensor([PROMPTS[row] + OUTPUTS[row]])
        want = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits[row : row + 1].clone())[0]
        counts = torch.bincount(torch.tensor(OUTPUTS[row]), minlength=VOCAB).float()
        want = want - 0.5 * counts - 0.25 * (counts > 0).float()  # only output tokens, not the prompt's
        assert torch.allclose(got[row], want, atol=0, rtol=1e-6), row


def test_the_sampler_picks_past_a_penalised_token():
    logits = torch.full((1, VOCAB), -1.0)
    logits[0, 7], logits[0, 8] = 3.0, 2.5
    meta = SamplingMetadata(
        [SamplingParams(temperature=0.0, repetition_penalty=1.3)], [[]], [None], prompt_token_ids=[[7]]
    )
    assert Sampler()(logits, meta).token_ids == [8]  # 3 / 1.3 = 2.31 < 2.5, from a prompt token alone


PROMPT_LENGTHS = [1, 7, 30]


def test_greedy_equals_transformers_generate(tiny_llama):
    model, _, path = tiny_llama
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    want, plain = [], []
    with torch.no_grad():
        for p in prompts:
            kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
            want.append(model.generate(torch.tensor([p]), repetition_penalty=1.3, **kw)[0, len(p) :].tolist())
            plain.append(model.generate(torch.tensor([p]), **kw)[0, len(p) :].tolist())
    assert want != plain  # the penalty changes this model's greedy output, so the test can fail
    llm = LLM(str(path), dtype="float32")
    # Batched with an unpenalised request: each row gets its own penalty, or none.
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, repetition_penalty=1.3)
    off = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([*prompts, prompts[1]], [params] * len(prompts) + [off])
    assert [o.outputs[0].token_ids for o in outs] == [*want, plain[1]]


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_sampling_metadata_carries_the_prompt_only_for_penalised_requests(penalty):
    """Requests without the penalty pay nothing for it: no prompt ids, no output slice."""
    p = SamplingParams(repetition_penalty=penalty)
    state = CachedRequestState("r", [4, 5, 6, 7, 8, 9], 3, p, [], 6, num_draft_tokens=2)
    meta = sampling_metadata([state], SchedulerOutput())
    if penalty == 1.0:
        assert meta.prompt_token_ids is None and meta.output_token_ids == [[], [], []]
    else:
        assert meta.prompt_token_ids == [[4, 5, 6]] * 3
        assert meta.output_token_ids == [[7], [7, 8], [7, 8, 9]]  # row j sees drafts 1..j-1 of 8, 9
