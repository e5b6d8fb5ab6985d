"""Speculative decoding keeps the sampled distribution: at temperature 1, the tokens at positions
2 to k + 2 (the first comes from the prefill and is never speculated) over many seeds are
distributed as without speculation.

The bound, derived rather than tuned: with N sequences on each side, one sequence changes an
empirical frequency (or the total variation distance between the two sides) by at most 1/N, so
by McDiarmid's inequality a difference beyond its mean by t has probability at most exp(-N t^2);
t = sqrt(ln(1e6) / N) leaves a one-in-a-million chance per check of failing when the
distributions are equal. The mean total variation over m observed tokens is at most
sqrt(m / (2 N)) (each frequency difference has standard deviation at most sqrt(2 p (1 - p) / N),
summed by Cauchy-Schwarz); a single frequency's mean difference is 0. The seeds are fixed, so
the test is deterministic on a host; the bound is what holds it on any host.

The drafts are the greedy continuation of the prompt (a scripted proposer): likely tokens, so
they are accepted often (a draft no sample would match tests nothing), and exact-match verified.
For a proposer whose draft is one token with certainty, accepting it when the sample equals it
and otherwise keeping the sample is rejection sampling (accept with p(d), else draw from p
without d, renormalised); a verifier that accepted too often would show in how often the draft
token comes out.
"""

from __future__ import annotations

import math
from collections import Counter

from scripted_drafts import ScriptedProposer

from tacit import LLM, SamplingParams

N = 800
K = 3
PROMPT = [5, 6, 7, 8] * 6
T = math.sqrt(math.log(1e6) / N)


def _samples(llm: LLM) -> list[list[int]]:
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=K + 2, ignore_eos=True, seed=i) for i in range(N)]
    return [list(o.outputs[0].token_ids) for o in llm.generate([PROMPT] * N, params)]


def test_sampled_tokens_after_the_first_are_distributed_as_without_speculation(tiny_llama):
    path = str(tiny_llama[2])
    plain = LLM(path, dtype="float32")
    greedy = plain.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=K + 2, ignore_eos=True))
    script = list(greedy[0].outputs[0].token_ids)
    off = _samples(plain)
    spec = LLM(path, dtype="float32")
    spec.engine.runner.drafter = ScriptedProposer({tuple(PROMPT): script}, k=K)
    spec.engine.scheduler.spec.min_tokens = K  # every draft verified
    on = _samples(spec)
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_accepted_tokens > N / 4  # drafts were verified, and often kept
    for pos in range(1, K + 2):
        a, b = Counter(s[pos] for s in off), Counter(s[pos] for s in on)
        m = len(a.keys() | b.keys())
        tv = sum(abs(a[t] - b[t]) for t in a.keys() | b.keys()) / (2 * N)
        assert tv <= math.sqrt(m / (2 * N)) + T, (pos, tv, m)
        follows = [sum(s[pos] == script[pos] for s in side) / N for side in (off, on)]
        assert abs(follows[0] - follows[1]) <= T, (pos, follows)
