"""Cut-in: a fresh request prefilled between two layers of the step in flight.

A step of 64 loaded sequences takes ~200 ms on the default model, so a request arriving
just after it started would wait that long before its own prefill even begins. The online
engine therefore asks schedule_cut_in() between two layers of the step in flight; a fresh
waiting request that outranks someone in that step and whose whole prompt fits
cut_in_prefill_tokens is prefilled there and then, and joins the running set (the next
schedule() preempts back down to max_num_seqs if the cut-in went over it: trim_running).

Each function takes the Scheduler as `s`, untyped: importing Scheduler here would close an
import cycle (scheduler.py imports this module).
"""

from __future__ import annotations

from tacit.scheduling.output_builder import build_scheduler_output
from tacit.scheduling.preemption import pick_victim
from tacit.scheduling.request import Request
from tacit.scheduling.scheduler_output import SchedulerOutput


def may_cut_in(s, req: Request) -> bool:
    """Would req be prefilled inside the step in flight if it arrived now (blocks allowing)?"""
    return (
        0 < req.num_tokens <= s.config.cut_in_prefill_tokens
        and not req.num_computed_tokens
        and not req.num_preemptions
        and any(s._outranks(req, r) for r in s.running)
    )


def schedule_cut_in(s) -> SchedulerOutput:
    """Requests to prefill now, between two layers of the step in flight (which is why
    only fresh ones qualify: a preempted request's blocks may be swapped or half-computed)."""
    scheduled: list[tuple[Request, int, list[int] | None]] = []
    budget = s.config.cut_in_prefill_tokens
    if not budget or not s.running or not s.waiting:
        return build_scheduler_output(s, scheduled, [])
    s.now = s.clock()
    for req in sorted(s.waiting, key=s._waiting_key):
        n = req.num_tokens
        if n > budget or not may_cut_in(s, req):
            continue
        if s.kv.allocate_slots(req.request_id, 0, s._slots(req, n)) is None:
            break
        s._start(req)
        scheduled.append((req, n, None))
        budget -= n
    s.num_cut_ins += len(scheduled)
    return build_scheduler_output(s, scheduled, [])


def trim_running(s, preempted: list[Request]) -> None:
    """Cut-ins join the running set even when it is full; preempt back to max_num_seqs."""
    while len(s.running) > s.config.max_num_seqs:
        s._preempt(pick_victim(s, s.running), preempted)
