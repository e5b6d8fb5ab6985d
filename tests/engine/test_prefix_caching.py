"""The prefix cache: a request whose leading full blocks another request already computed takes
those blocks instead of prefilling them, and its tokens are exactly what they are without the
cache (float32, greedy). Each case runs the same requests on an engine with the cache and one
without, one request after another so the earlier ones' blocks are cached."""

from __future__ import annotations

import pytest
from counted_steps import GREEDY, one_by_one

from tacit import LLM, SamplingParams

SHARED = list(range(20, 30))  # 10 tokens: with 4-token blocks, 2 full blocks and half a third
PROMPTS = [SHARED + [40, 41, 42], SHARED + [50, 51, 52, 53, 54, 55], SHARED + [40, 41, 42, 43], SHARED[:9]]


def _engines(path, **kw):
    return (
        LLM(str(path), dtype="float32", block_size=4, **kw),
        LLM(str(path), dtype="float32", block_size=4, enable_prefix_caching=False, **kw),
    )


@pytest.mark.parametrize("arch,kw", [("llama", {}), ("llama", {"kv_cache_dtype": "int8"}), ("deepseek_v3", {})])
def test_hits_skip_their_blocks_and_change_no_token(tiny_model_factory, arch, kw):
    _, _, path = tiny_model_factory(arch)
    cached, plain = _engines(path, **kw)
    got, computed = one_by_one(cached, PROMPTS)
    want, full = one_by_one(plain, PROMPTS)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    # The first prompt finds nothing; the others find the shared prefix's 2 full blocks (its
    # third block is partly shared: never), and the third also the blocks the first finished.
    assert [o.num_cached_tokens for o in got] == [0, 8, 12, 8]
    assert [o.num_cached_tokens for o in want] == [0, 0, 0, 0]
    # Cached tokens are exactly the ones not computed.
    assert [f - c for f, c in zip(full, computed)] == [0, 8, 12, 8]


def test_a_hit_after_eviction_and_reinsertion(tiny_model_factory):
    """A pool of 8 blocks: other prompts evict the cached prefix, the next request recomputes
    it (no hit, same tokens) and caches it again for the one after."""
    _, _, path = tiny_model_factory("llama")
    cached, plain = _engines(path, num_kv_blocks=8)
    others = [[90 + i] * 20 for i in range(3)]  # 5 full blocks each: the prefix's blocks go
    sequence = [PROMPTS[0], *others, PROMPTS[0], PROMPTS[0]]
    got, _ = one_by_one(cached, sequence)
    want, _ = one_by_one(plain, sequence)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert [o.num_cached_tokens for o in got][-2:] == [0, 12]


def test_a_preempted_request_resumes_from_its_cached_blocks(tiny_model_factory):
    _, _, path = tiny_model_factory("llama")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[5 + i] * 14 for i in range(4)]
    outs = {}
    for enable in (True, False):
        llm = LLM(
            str(path), dtype="float32", block_size=4, num_kv_blocks=24, swap_space=0, enable_prefix_caching=enable
        )
        outs[enable] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        kv = llm.engine.scheduler.kv
        assert llm.engine.scheduler.num_preemptions > 0
        if enable:  # the recomputed requests found their own blocks
            assert kv.prefix_cache_hits > 0
    assert outs[True] == outs[False]


def test_prompt_logprobs_requests_compute_their_prompt_but_share_it(tiny_model_factory):
    _, _, path = tiny_model_factory("llama")
    cached, plain = _engines(path)
    scored = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=2)
    got, _ = one_by_one(cached, [PROMPTS[0], PROMPTS[0]], scored)
    want, _ = one_by_one(plain, [PROMPTS[0]], scored)
    assert [o.num_cached_tokens for o in got] == [0, 0]  # the scored positions need their logits
    for o in got:
        assert o.outputs[0].token_ids == want[0].outputs[0].token_ids
        for a, b in zip(o.prompt_logprobs[1:], want[0].prompt_logprobs[1:]):
            assert {t: round(l.logprob, 4) for t, l in a.items()} == {t: round(l.logprob, 4) for t, l in b.items()}
    (after,), _ = one_by_one(cached, [PROMPTS[0]])
    assert after.num_cached_tokens == 12  # what the scored requests computed is found by others


def test_requests_with_different_cache_salts_share_nothing(tiny_model_factory):
    _, _, path = tiny_model_factory("llama")
    cached, _ = _engines(path)
    a, _ = one_by_one(cached, [PROMPTS[0]], cache_salt="tenant-a")
    b, _ = one_by_one(cached, [PROMPTS[0]], cache_salt="tenant-b")
    unsalted, _ = one_by_one(cached, [PROMPTS[0]])
    again, _ = one_by_one(cached, [PROMPTS[0]], cache_salt="tenant-a")
    assert [x[0].num_cached_tokens for x in (a, b, unsalted, again)] == [0, 0, 0, 12]
    assert len({tuple(x[0].outputs[0].token_ids) for x in (a, b, unsalted, again)}) == 1
    with pytest.raises(ValueError, match="cache_salt=''"):
        cached.engine.add_request(PROMPTS[0], GREEDY, cache_salt="")


def test_a_next_turn_hits_the_previous_answer_but_not_its_last_token(tiny_model_factory):
    """Multi-turn: the next prompt is the previous prompt, its answer and a new message. The
    answer's last token was sampled but never computed, so the block it completes is not cached
    (13 + 7 = 20 tokens, 19 computed: 4 blocks of 4 are, the fifth is not)."""
    _, _, path = tiny_model_factory("llama")
    cached, plain = _engines(path)
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    (first,), _ = one_by_one(cached, [PROMPTS[0]], params)
    turn = PROMPTS[0] + list(first.outputs[0].token_ids) + [60, 61, 62]
    (got,), computed = one_by_one(cached, [turn], params)
    (want,), _ = one_by_one(plain, [turn], params)
    assert got.num_cached_tokens == 16 and computed == [len(turn) - 16 + 6]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids


def test_cache_aware_order_serves_the_hit_first_and_changes_no_token(tiny_model_factory):
    """One request a step: of a cold request and a later one whose prefix is cached (same
    arrival time, so the same arrival window), the cached one goes first with the cache on and
    second without; each one's tokens are the same either way (prefix_order.py)."""
    _, _, path = tiny_model_factory("llama")
    cold, hot = [70 + i for i in range(13)], PROMPTS[0] + [44]
    outs, orders = {}, {}
    for llm in _engines(path, max_num_seqs=1):
        engine = llm.engine
        one_by_one(llm, [PROMPTS[0]])  # caches SHARED's blocks and more
        a, b = engine.add_request(cold, GREEDY), engine.add_request(hot, GREEDY)
        engine.scheduler.requests[b].arrival_time = engine.scheduler.requests[a].arrival_time
        order, got = [], {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    order.append(o.request_id)
                    got[o.request_id] = o.outputs[0].token_ids
        caching = engine.scheduler.kv.enable_caching
        outs[caching] = [got[a], got[b]]
        orders[caching] = [{a: "cold", b: "hot"}[r] for r in order]
    assert orders == {True: ["hot", "cold"], False: ["cold", "hot"]}
    assert outs[True] == outs[False]


def test_a_sliding_window_model_hits_with_only_the_windows_blocks(tiny_model_factory):
    """qwen3_sliding's layer 1 attends to its last 24 positions: a 60-token hit hands its
    sliding group only the blocks positions 37-59 lie in (block 0 stands for the 9 before),
    and no token changes."""
    _, _, path = tiny_model_factory("qwen3_sliding")
    long = list(range(20, 80))  # 15 blocks of 4
    prompts = [long + [90, 91], long + [95, 96, 97]]
    cached, plain = _engines(path)
    got, computed = one_by_one(cached, prompts)
    want, full = one_by_one(plain, prompts)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert [o.num_cached_tokens for o in got] == [0, 60]
    assert [f - c for f, c in zip(full, computed)] == [0, 60]
    assert len(cached.engine.kv_cache_config.kv_cache_groups) == 2
