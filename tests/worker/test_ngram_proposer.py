"""Speculative decoding with prompt-lookup (n-gram) drafts: the proposer, the config that turns
it on (vLLM's --speculative-config), and greedy output unchanged by it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tacit import LLM, SamplingParams
from tacit.config.speculative import SPECULATIVE_METHODS, SpeculativeConfig, parse_speculative_config
from tacit.engine.metrics import ServingMetrics
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.worker.drafter import DRAFT_PROPOSERS
from tacit.worker.ngram_proposer import ngram_drafts
from tacit.worker.speculative import build_drafter

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# Every draft verified: what the draft-length controller would choose depends on this host's step
# times (a cold first step once made it verify none here); tests/scheduling/test_spec_controller.py
# tests the controller.
NGRAM_ALL = {**NGRAM, "min_speculative_tokens": 3}


def drafts(tokens, k=3, n_max=3, n_min=1):
    return ngram_drafts(np.array(tokens), k, n_max, n_min)


def test_the_latest_match_of_the_longest_suffix_proposes_what_followed_it():
    assert drafts([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]) == [7, 8, 5]  # "2 3" last seen before 7 8 5
    assert drafts([5, 6, 7, 1, 2, 5, 6, 7]) == [1, 2, 5]  # 3-gram "5 6 7"
    assert drafts([4, 1, 2, 3, 4, 9], n_min=1) == []  # 9 never occurred before
    assert drafts([1, 2, 1, 2, 1, 2], k=2) == [1, 2]
    assert drafts([8, 8, 8, 8]) == [8]  # the match just before the end: only the last token follows
    assert drafts([3]) == []


def test_every_method_the_config_knows_has_a_proposer():
    build_drafter(None)
    config = SpeculativeConfig.from_dict(parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 2}'))
    assert build_drafter(config).k == 2
    assert sorted(DRAFT_PROPOSERS) == sorted(SPECULATIVE_METHODS)


@pytest.mark.parametrize(
    "value, match",
    [
        (
            {"method": "eagle", "num_speculative_tokens": 3},
            "method='eagle' is not known; valid: ngram, suffix, draft_model",
        ),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens=0 is invalid"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, r"keys \['lookahead'\] are not known"),
        ({**NGRAM, "prompt_lookup_min": 4}, "prompt_lookup_min=4 is above prompt_lookup_max=3"),
    ],
)
def test_bad_speculative_configs_are_named(tiny_llama, value, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_llama[2]), dtype="float32", speculative_config=value)


def test_the_cli_flag_takes_json_and_refuses_anything_else():
    assert parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 2}')["num_speculative_tokens"] == 2
    with pytest.raises(ValueError, match="is not JSON"):
        parse_speculative_config("ngram:4")


def test_ngram_drafts_change_no_greedy_token_and_save_steps_on_repetition(tiny_llama):
    path = str(tiny_llama[2])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)
    # A repetitive prompt: the model's greedy continuation of a loop tends to loop too.
    prompts = [[5, 6, 7, 8] * 6, list(range(30, 50)), [9, 10] * 10]
    plain = LLM(path, dtype="float32")
    spec = LLM(path, dtype="float32", speculative_config=NGRAM_ALL)
    want = plain.generate(prompts, params)
    got = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    for a, b in zip(got, want):
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert {t: round(lp.logprob, 4) for t, lp in x.items()} == {t: round(lp.logprob, 4) for t, lp in y.items()}
    stats = spec.engine.get_stats()
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens  # right and wrong ones
    text = ServingMetrics(snapshot=stats).render_prometheus("m")
    for name in ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
        value = getattr(stats, name.split(":")[1])
        assert f'{name}_total{{model_name="m",engine="0"}} {value}' in text
    alone = [LLM(path, dtype="float32", speculative_config=NGRAM_ALL).engine for _ in prompts]
    for engine, p in zip(alone, prompts):
        engine.add_request(p, params)
        while engine.has_unfinished_requests():
            engine.step()
    # Each accepted draft is a step saved for its request (24 tokens: 24 steps one token a step).
    assert sum(e.num_steps for e in alone) < 3 * 24
    assert sum(e.get_stats().spec_decode_num_accepted_tokens for e in alone) == 3 * 24 - sum(e.num_steps for e in alone)


@pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="the fused C++ decoder needs the CPU kernels",
)
def test_verify_rows_run_on_the_fused_decoder_and_change_no_bf16_token(tiny_llama, monkeypatch):
    """In bf16 on GGML int4 weights (the default model's kind) the fused decoder runs each verify
    row as its tokens' decode rows: with 3 drafts a batch-1 verify is 4 rows, the range in which
    the int8-activation GEMVs sum each row exactly as alone (5-8 rows take their bf16 path), and
    every row's KV of a layer is written before any row attends, so the greedy tokens are those
    of one token a step. (Batches whose rows pass 4 round otherwise with speculation than
    without, as a batch of 5-8 decodes already rounds otherwise than one.)"""
    from tacit.worker.paths import fused_decode

    path = str(tiny_llama[2])
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    prompts = [[5, 6, 7, 8] * 6, [9, 10] * 10, list(range(30, 50))]
    plain = LLM(path, dtype="bfloat16", quantization="int4")
    want = [plain.generate([p], params)[0].outputs[0].token_ids for p in prompts]  # batch 1, each
    verify_rows = []
    real = fused_decode.fused_decode_hidden

    def counting(ctx, rows, pausable):
        verify_rows.extend(n for _, n in rows if n > 1)
        return (yield from real(ctx, rows, pausable))

    monkeypatch.setattr(fused_decode, "fused_decode_hidden", counting)
    spec = LLM(path, dtype="bfloat16", quantization="int4", speculative_config={**NGRAM, "min_speculative_tokens": 3})
    got = [spec.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert got == want
    assert verify_rows and max(verify_rows) == 4  # 3 drafts and the last token, one fused call
    assert spec.engine.get_stats().spec_decode_num_accepted_tokens > 0
