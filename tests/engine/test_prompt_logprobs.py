"""Prompt logprobs (SamplingParams.prompt_logprobs) and max_tokens=0 against transformers' float32
log_softmax at every prompt position: unchunked, forced into many chunks, batched beside
ordinary decoding, and across a preemption that recomputes the prompt."""

import pytest
import torch

from tacit import LLM, SamplingParams

TOP = 3


@pytest.fixture(scope="module")
def ref(tiny_llama):
    """(path, prompt, transformers' logprobs [positions, vocab]) for a 40-token prompt."""
    model, _, path = tiny_llama
    prompt = torch.randint(3, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.no_grad():
        logprobs = model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    return path, prompt, logprobs


@pytest.fixture(scope="module")
def unchunked(ref):
    return LLM(str(ref[0]), dtype="float32")


@pytest.fixture(scope="module")
def chunked(ref):
    # 8 prompt tokens a step at most: the 40-token prompt prefills in 5 chunks.
    return LLM(str(ref[0]), dtype="float32", max_num_batched_tokens=16, long_prefill_token_threshold=8)


def scoring(**kw):
    return SamplingParams(temperature=0.0, prompt_logprobs=TOP, **kw)


def check_against_reference(prompt_logprobs, prompt, logprobs, top=TOP):
    assert len(prompt_logprobs) == len(prompt)
    assert prompt_logprobs[0] is None
    for t in range(1, len(prompt)):
        row, entry, token = logprobs[t - 1], prompt_logprobs[t], prompt[t]
        assert abs(entry[token].logprob - float(row[token])) < 1e-4, f"prompt token {t}"
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        ref_top = row.topk(top).indices.tolist()
        ranked = [tid for tid, lp in sorted(entry.items(), key=lambda kv: kv[1].rank) if lp.rank <= top]
        assert ranked == ref_top, f"prompt token {t}: top-{top}"
        assert len(entry) == top + (token not in ref_top)
        for tid in ref_top:
            assert abs(entry[tid].logprob - float(row[tid])) < 1e-4


def test_every_prompt_position_matches_transformers_chunked_or_not(ref, unchunked, chunked):
    _, prompt, logprobs = ref
    whole = unchunked.generate([prompt], scoring(max_tokens=2))[0]
    steps_before = chunked.engine.num_steps
    parts = chunked.generate([prompt], scoring(max_tokens=2))[0]
    assert chunked.engine.num_steps - steps_before >= 5  # 5 prefill chunks, then the second token
    for out in (whole, parts):
        check_against_reference(out.prompt_logprobs, prompt, logprobs)
        assert len(out.outputs[0].token_ids) == 2
    # The same numbers whichever way the prompt was cut: each token is scored from the same position.
    for a, b in zip(whole.prompt_logprobs[1:], parts.prompt_logprobs[1:]):
        assert a.keys() == b.keys()
        for tid in a:
            assert a[tid].rank == b[tid].rank and abs(a[tid].logprob - b[tid].logprob) < 1e-5


def test_batched_with_ordinary_decoding(ref, chunked):
    _, prompt, logprobs = ref
    others = [[5, 6, 7], list(range(20, 31))]
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = chunked.generate(others, plain)
    # The ordinary requests run first, so they decode while the scored prompt prefills in chunks.
    outs = chunked.generate([*others, prompt], [plain, plain, scoring(max_tokens=3, logprobs=1)])
    for a, b in zip(alone, outs):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert b.prompt_logprobs is None
    check_against_reference(outs[2].prompt_logprobs, prompt, logprobs)
    # prompt_logprobs=0: only the prompt's own tokens, as vLLM.
    zero = chunked.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))[0]
    assert [list(e) for e in zero.prompt_logprobs[1:]] == [[t] for t in prompt[1:]]


def test_max_tokens_zero_scores_without_generating(ref, chunked):
    path, prompt, logprobs = ref
    out = chunked.generate([prompt], scoring(max_tokens=0, n=2))[0]
    assert [(c.token_ids, c.text, c.finish_reason) for c in out.outputs] == [([], "", "length")] * 2
    assert out.finished
    check_against_reference(out.prompt_logprobs, prompt, logprobs)
    assert not chunked.engine.has_unfinished_requests()
    assert chunked.engine.get_stats().kv_blocks_used == 0
    # Without prompt_logprobs it is just a prefill; and a prompt as long as the context may be scored.
    short = LLM(str(path), dtype="float32", max_model_len=40)
    only = short.generate([prompt], SamplingParams(max_tokens=0))[0]
    assert only.prompt_logprobs is None and only.outputs[0].token_ids == []
    check_against_reference(short.generate([prompt], scoring(max_tokens=0))[0].prompt_logprobs, prompt, logprobs)
    with pytest.raises(ValueError, match="as long only with max_tokens=0"):
        short.generate([prompt], SamplingParams(max_tokens=1))


def test_preempted_mid_prefill_scores_each_token_once(ref):
    path, prompt, logprobs = ref
    llm = LLM(
        str(path),
        dtype="float32",
        scheduling_policy="priority",
        max_num_seqs=1,
        max_num_batched_tokens=16,
        long_prefill_token_threshold=8,
        preemption_mode="recompute",
    )
    engine = llm.engine
    engine.add_request(prompt, scoring(max_tokens=2), request_id="low", priority=1)
    engine.step()
    engine.step()  # 16 of its 40 prompt tokens computed, 16 scored
    engine.add_request([9, 10, 11], SamplingParams(max_tokens=2), request_id="urgent", priority=0)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "low":
                # Never more entries than prompt tokens, even while the prompt is recomputed.
                assert len(out.prompt_logprobs) <= len(prompt)
            if out.finished:
                done[out.request_id] = out
    assert engine.get_stats().num_preemptions >= 1
    check_against_reference(done["low"].prompt_logprobs, prompt, logprobs)
