"""Scheduler-level helpers: requests, a fake clock, and a step that pretends to run the model."""

from __future__ import annotations

from tacit.sampling_params import SamplingParams
from tacit.scheduling.request import Request
from tacit.scheduling.scheduler import Scheduler


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_req(rid: str, n_prompt: int, priority: int = 0, max_tokens: int = 8, arrival: float | None = None,
             ttft_ms: float | None = None) -> Request:
    r = Request(rid, list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens,
                priority=priority, arrival_time=arrival)
    r.ttft_slo = None if ttft_ms is None else ttft_ms / 1000
    return r


def run_step(s: Scheduler, now: float | None = None) -> list[str]:
    """One step: computed tokens advance, a request level with its tokens samples token 7 and
    finishes at max_tokens. Returns the scheduled ids."""
    return [r.request_id for r, _ in advance(s, s.schedule(), now)]


def advance(s: Scheduler, out, now: float | None = None) -> list:
    """Apply a SchedulerOutput as if the model had run it; returns out.scheduled."""
    for req, n in out.scheduled:
        req.num_computed_tokens += n
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token(7)
            if now is not None and req.first_token_time is None:
                req.first_token_time = now
            if len(req.output_token_ids) >= req.max_tokens:
                req.finish("length")
                s.finish(req)
    return out.scheduled
