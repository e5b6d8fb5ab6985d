"""Every registered scheduling policy against fcfs, the reference: a policy may change who runs
when, never what anyone gets. Mixed priorities, a pool small enough to force preemptions, and
greedy sampling: each request's tokens must equal the fcfs run's, and every request finishes."""

import pytest

from tacit import LLM, SamplingParams
from tacit.scheduling.policy import POLICIES

PROMPTS = [[5 + i] * (20 + 9 * i) for i in range(6)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def run(path: str, policy: str) -> tuple[list[list[int]], int]:
    llm = LLM(path, dtype="float32", scheduling_policy=policy, max_num_seqs=3, num_kv_blocks=14, block_size=8)
    e = llm.engine
    ids = [e.add_request(p, PARAMS, priority=9) for p in PROMPTS[:3]]
    e.step()
    ids += [e.add_request(p, PARAMS, priority=i % 2) for i, p in enumerate(PROMPTS[3:])]
    results = {}
    for _ in range(500):
        if not e.has_unfinished_requests():
            break
        for out in e.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
    assert set(results) == set(ids), f"{policy}: requests left unfinished"
    return [results[i] for i in ids], e.get_stats().num_preemptions


def test_every_policy_is_registered():
    assert {"fcfs", "priority", "sjf", "sla"} <= set(POLICIES)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_changes_order_never_tokens(tiny_llama, policy):
    path = str(tiny_llama[2])
    ref = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(PROMPTS, PARAMS)]
    tokens, preemptions = run(path, policy)
    assert tokens == ref
    if policy != "fcfs":
        assert preemptions > 0, "the pool is sized so that urgent arrivals preempt someone"
