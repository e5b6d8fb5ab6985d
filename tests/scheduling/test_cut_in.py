"""Cut-in: an urgent request arriving during a step is prefilled between that step's layers,
and nobody's tokens change for it (greedy, float32, so every run must match token for token)."""

import pytest

from tacit import LLM, SamplingParams
from tacit.worker.paths.base import finish

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
BATCH = [[5 + i] * (20 + 3 * i) for i in range(3)]
URGENT = [9, 8, 7, 6, 5, 4, 3]


def _reference(path: str) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(BATCH + [URGENT], PARAMS)]


def _run_with_arrival(path: str, policy: str, urgent_priority: int = 0, **kw):
    """Batch work at priority 1 runs; during the third step's forward the urgent request arrives
    and cut_in_step() is offered at every layer boundary, as the online engine does."""
    e = LLM(path, dtype="float32", scheduling_policy=policy, **kw).engine
    ids = [e.add_request(p, PARAMS, priority=1) for p in BATCH]
    for _ in range(2):
        e.step()
    state = {"urgent": None, "cut_in_outputs": [], "boundaries": 0}

    def between_layers():
        state["boundaries"] += 1
        if state["urgent"] is None:
            state["urgent"] = e.add_request(URGENT, PARAMS, priority=urgent_priority)
        state["cut_in_outputs"] += e.cut_in_step()

    finish(e.step_in_layers(), between_layers)
    done = {}
    while e.has_unfinished_requests():
        for out in e.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return [done[i] for i in ids + [state["urgent"]]], state, e


def test_urgent_request_cuts_in_and_every_output_is_unchanged(tiny_llama):
    path = str(tiny_llama[2])
    ref = _reference(path)
    out, state, e = _run_with_arrival(path, "priority")
    assert state["boundaries"] > 0, "the step offered no layer boundary"
    first = [o for o in state["cut_in_outputs"] if o.request_id == state["urgent"]]
    assert first and len(first[0].outputs[0].token_ids) == 1, "the urgent request got no token mid-step"
    assert e.get_stats().num_cut_ins == 1
    assert out == ref


def test_cut_in_past_max_num_seqs_is_preempted_back_with_identical_tokens(tiny_llama):
    path = str(tiny_llama[2])
    ref = _reference(path)
    out, _, e = _run_with_arrival(path, "priority", max_num_seqs=3)
    assert e.get_stats().num_cut_ins == 1 and e.scheduler.num_preemptions >= 1
    assert out == ref


@pytest.mark.parametrize(
    "policy, priority, kw",
    [
        ("fcfs", 0, {}),  # fcfs never lets anyone cut in
        ("priority", 1, {}),  # same class as the running work: no cut-in
        ("priority", 0, {"cut_in_prefill_tokens": 4}),  # prompt longer than the cut-in cap
        ("priority", 0, {"cut_in_prefill_tokens": 0}),  # turned off
    ],
)
def test_no_cut_in_when_the_policy_or_the_cap_says_no(tiny_llama, policy, priority, kw):
    path = str(tiny_llama[2])
    out, state, e = _run_with_arrival(path, policy, urgent_priority=priority, **kw)
    assert e.get_stats().num_cut_ins == 0 and not state["cut_in_outputs"]
    assert out == _reference(path)


def test_bad_cut_in_cap_is_named(tiny_llama):
    with pytest.raises(ValueError, match="cut_in_prefill_tokens=-5 is invalid: must be an integer >= 0"):
        LLM(str(tiny_llama[2]), cut_in_prefill_tokens=-5)


def test_a_cut_in_runs_beside_the_paused_step_not_inside_it(tiny_llama):
    """The paused step's frames are suspended, not under the cut-in's: when the cut-in's forward
    starts, the stack holds one runner step (its own), and the cut-in's tokens still equal a
    plain run's."""
    import inspect

    e = LLM(str(tiny_llama[2]), dtype="float32", scheduling_policy="priority").engine
    runner = e.runner
    real = runner.forward_steps
    depths = []

    def forward_steps(rows, pausable):
        depths.append(sum(f.function == "execute_steps" for f in inspect.stack()))
        return (yield from real(rows, pausable))

    runner.forward_steps = forward_steps
    for p in BATCH:
        e.add_request(p, PARAMS, priority=1)
    e.step()
    urgent = []

    def at_pause():
        if not urgent:
            urgent.append(e.add_request(URGENT, PARAMS, priority=0))
            assert e.cut_in_step(), "the urgent request should have cut in"

    finish(e.step_in_layers(), at_pause)
    assert e.get_stats().num_cut_ins == 1 and depths[-2:] == [1, 1]
