"""Scheduler-level helpers: requests, a fake clock, and a step that pretends to run the model."""

from __future__ import annotations

from tacit.outputs import ModelRunnerOutput
from tacit.sampling_params import SamplingParams
from tacit.scheduling.request import Request
from tacit.scheduling.scheduler import Scheduler
from tacit.scheduling.scheduler_output import SchedulerOutput


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_req(
    rid: str,
    n_prompt: int,
    priority: int = 0,
    max_tokens: int = 8,
    arrival: float | None = None,
    ttft_ms: float | None = None,
) -> Request:
    r = Request(
        rid,
        list(range(1, n_prompt + 1)),
        SamplingParams(max_tokens=max_tokens),
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=arrival,
    )
    r.ttft_slo = None if ttft_ms is None else ttft_ms / 1000
    return r


def run_step(s: Scheduler, now: float | None = None) -> list[str]:
    """One step: computed tokens advance, a request level with its tokens samples token 7 and
    finishes at max_tokens. Returns the scheduled ids."""
    return advance(s, s.schedule(), now)


def advance(s: Scheduler, out: SchedulerOutput, now: float | None = None) -> list[str]:
    """Hand a SchedulerOutput back through update_from_output as if the model had run it (every
    request level with its tokens samples token 7); returns the scheduled ids. `now` sets the
    scheduler's clock for the step's token times, when its clock is a FakeClock."""
    if now is not None and isinstance(s.clock, FakeClock):
        s.clock.t = now
    sampled = [
        rid
        for rid, n in out.num_scheduled_tokens.items()
        if s.requests[rid].num_computed_tokens + n == s.requests[rid].num_tokens
    ]
    # The step "takes" what the cost model predicts, so faking steps does not disturb what tests teach it.
    decodes = sum(n == 1 for n in out.num_scheduled_tokens.values())
    seconds = s.cost.step_s(out.total_num_scheduled_tokens - decodes, decodes)
    s.update_from_output(out, ModelRunnerOutput(sampled, [[7] for _ in sampled], [None] * len(sampled), seconds))
    return out.req_ids
