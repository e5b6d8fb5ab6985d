"""tune.measure: one trial on the real engine, replayed on the wall clock, on a tiny random Llama.

Failing configurations come back as ok=False naming the cause, and the process can measure
again afterwards; an interrupt still stops the trial and takes the engine down with it.
"""

from __future__ import annotations

import signal
import threading

import pytest

from tacit.bench.workload_file import WorkloadRequest
from tacit.config.engine_args import EngineArgs
from tacit.tune.measure import measure
from tacit.tune.objective import SLO

# Two classes; output lengths all different, so an outcome shows which request it belongs to.
WORKLOAD = [
    WorkloadRequest(0.00, 24, 6, 1),
    WorkloadRequest(0.00, 40, 7, 0),
    WorkloadRequest(0.05, 16, 8, 1),
    WorkloadRequest(0.10, 32, 5, 0),
    WorkloadRequest(0.20, 48, 9, 1),
    WorkloadRequest(0.30, 20, 4, 0),
]


def args(model_dir, **kw) -> EngineArgs:
    return EngineArgs(model=str(model_dir), dtype="float32", device="cpu", **kw)


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tacit-engine" and t.is_alive()]


def test_a_trial_replays_every_request_in_order_on_the_wall_clock(tiny_llama):
    _, _, model_dir = tiny_llama
    seen = []
    r = measure(args(model_dir, scheduling_policy="priority"), WORKLOAD, progress=lambda d, n: seen.append((d, n)))
    assert r.ok, r.error
    assert r.error == ""
    assert [(o.priority, o.output_tokens) for o in r.outcomes] == [(w.priority, w.output_len) for w in WORKLOAD]
    assert all(o.ok and 0 < o.ttft < o.e2e for o in r.outcomes)
    # A request completes no earlier than its arrival plus its own e2e (it is handed over at or
    # after its arrival), and the trial lasts until the last of them.
    assert r.duration_s >= max(w.arrival_s + o.e2e for w, o in zip(WORKLOAD, r.outcomes))
    assert r.duration_s >= WORKLOAD[-1].arrival_s
    assert seen == [(i, len(WORKLOAD)) for i in range(1, len(WORKLOAD) + 1)]
    s = r.score(SLO(classes={0: {"ttft": 60.0}}, default={"e2e": 60.0}))
    assert s["completed"] == 6 and s["failed"] == 0
    assert s["goodput_req_s"] == pytest.approx(6 / r.duration_s)
    assert engine_threads() == []


def test_configurations_that_cannot_run_are_infeasible_not_errors(tiny_llama):
    _, _, model_dir = tiny_llama
    bad_knob = measure(args(model_dir, scheduling_policy="nope"), WORKLOAD)
    assert not bad_knob.ok
    assert "could not be built" in bad_knob.error and "scheduling_policy='nope' is not known" in bad_knob.error
    # 2 blocks of 16 tokens cap max_model_len at 32; request 4 needs 48 + 9 = 57.
    small = measure(args(model_dir, block_size=16, num_kv_blocks=2), WORKLOAD)
    assert not small.ok
    assert "workload request 4 needs 57 tokens" in small.error and "max_model_len 32" in small.error
    assert "num_kv_blocks" in small.error
    with pytest.raises(ValueError, match="this trial failed .* infeasible"):
        small.score(SLO())
    assert engine_threads() == []
    # The process is still fit to measure.
    again = measure(args(model_dir), WORKLOAD[:2])
    assert again.ok, again.error
    assert [o.output_tokens for o in again.outcomes] == [6, 7]


def test_an_interrupt_propagates_and_the_engine_is_shut_down(tiny_llama):
    _, _, model_dir = tiny_llama

    def interrupt(done: int, total: int) -> None:
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, as a user stopping the tuner sends it

    with pytest.raises(KeyboardInterrupt):
        measure(args(model_dir), WORKLOAD, progress=interrupt)  # at the first completion: mid-trial
    assert engine_threads() == []


def test_workload_is_checked():
    with pytest.raises(ValueError, match="at least one request"):
        measure(EngineArgs(), [])
    with pytest.raises(ValueError, match=r"workload\[0\] is dict; must be a WorkloadRequest"):
        measure(EngineArgs(), [{"arrival_s": 0, "input_len": 4, "output_len": 4}])
