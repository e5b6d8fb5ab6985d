"""Suffix drafts: the longest earlier match of a request's suffix, in its own tokens or in recent
requests' outputs, continued by the majority of its occurrences while the majority is likely
enough; greedy output unchanged by them."""

from __future__ import annotations

import pytest

from tacit import LLM, SamplingParams
from tacit.worker.suffix_proposer import _PER_KEY, SuffixIndex, suffix_drafts

SUFFIX = {"method": "suffix", "num_speculative_tokens": 4}


def drafts(context, others=(), k=4, depth=24, min_prob=0.1, factor=4.0):
    index = SuffixIndex()
    index.update("self", context)
    for i, seq in enumerate(others):
        index.update(i, list(seq))
    return suffix_drafts(context, index.occurrences(context), k, depth, min_prob, factor)


def test_the_longest_match_wins_and_its_majority_continuation_is_proposed():
    # "1 2" occurs three times; only the last two share the longer suffix "9 1 2", and both
    # continue 5 6: the older, shorter match (1 2 -> 7) loses. Then they part (9 or 0, one each:
    # a tie goes to the earlier), and the path follows that one alone.
    assert drafts([1, 2, 7, 7, 9, 1, 2, 5, 6, 9, 1, 2, 5, 6, 0, 9, 1, 2]) == [5, 6, 9, 1]
    # Two occurrences of the longest match disagreeing at the second draft: the majority of one
    # each is half the occurrences (>= 0.1), so the first-counted continues.
    assert drafts([3, 4, 8, 1, 3, 4, 8, 2, 3, 4, 8], k=2)[0] in (1, 2)


def test_the_majority_must_be_likely_enough():
    # Ten occurrences of "4 4", each followed by a different token: no continuation is 0.2 of them.
    context = [t for i in range(10) for t in (4, 4, 100 + i)] + [4, 4]
    assert drafts(context, min_prob=0.2) == []
    # 1 in 10 clears 0.1; the path is then that one occurrence, followed while it lasts.
    assert drafts(context, min_prob=0.1) == [100, 4, 4, 101]


def test_other_requests_outputs_are_searched_and_a_short_match_proposes_little():
    out = [11, 12, 13, 14, 15, 16, 17]
    assert drafts([50, 11, 12], others=[out], factor=1.0) == [13, 14]  # 2 matched: at most 2
    assert drafts([50, 11, 12], others=[out], factor=4.0) == [13, 14, 15, 16]
    assert drafts([50, 11, 12], others=[out], depth=2, k=1) == [13]


def test_the_index_is_bounded():
    index = SuffixIndex(max_sequences=2)
    for sid in range(3):
        index.update(sid, [1, 2, 3, sid])
    assert list(index.seqs) == [1, 2]  # the oldest sequence went
    assert len(index.occurrences([1, 2])) == 2
    big = SuffixIndex()
    big.update("x", [7, 7] * (4 * _PER_KEY))
    assert len(big.occurrences([7, 7])) == _PER_KEY


def test_suffix_drafts_change_no_greedy_token_and_learn_from_finished_requests(tiny_llama):
    path = str(tiny_llama[2])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[5, 6, 7, 8] * 6, list(range(30, 50)), [9, 10] * 10]
    plain = LLM(path, dtype="float32")
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    spec = LLM(path, dtype="float32", speculative_config={**SUFFIX, "min_speculative_tokens": 4})
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params)]
    assert got == want
    # The same random prompt again: its own tokens hold no repeat, but the first run's output does.
    before = spec.engine.get_stats().spec_decode_num_accepted_tokens
    again = spec.generate([prompts[1]], params)[0].outputs[0].token_ids
    assert again == want[1]
    assert spec.engine.get_stats().spec_decode_num_accepted_tokens - before >= 12


@pytest.mark.parametrize(
    "value, match",
    [
        ({**SUFFIX, "prompt_lookup_max": 3}, r"keys \['prompt_lookup_max'\] belong to another method than 'suffix'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8}, "belong to another"),
        ({**SUFFIX, "suffix_decoding_min_token_prob": 0.0}, "suffix_decoding_min_token_prob=0.0 is invalid"),
        ({**SUFFIX, "suffix_decoding_max_spec_factor": float("nan")}, "suffix_decoding_max_spec_factor=nan"),
        ({**SUFFIX, "min_speculative_tokens": 5}, "min_speculative_tokens=5 is invalid"),
    ],
)
def test_bad_suffix_configs_are_named(value, match):
    from tacit.config.speculative import SpeculativeConfig

    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.from_dict(value)
