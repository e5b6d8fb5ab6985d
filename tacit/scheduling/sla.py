"""The sla policy: order by slack against each request's TTFT/TPOT target, admit only what can
meet its TTFT.

A request's next token is due at its deadline (arrival + TTFT target for the first token;
last token + TPOT target after a preemption). Its latest start is that deadline minus the time
its remaining prefill needs, estimated from measured steps (StepCostModel). Within a priority
class, waiting work runs in order of latest start (least slack first: slack = latest start -
now, and `now` is the same for everyone, so the order needs no clock). Work whose latest start
has passed can no longer meet its target; it is deferred behind everything in its class that
still can, and behind work with no target, because serving it first would only make others
miss too (goodput, not throughput).

Admission: on arrival, a request with a TTFT target whose estimated time to first token (its
own prefill plus the prefill queued ahead of it, at the measured per-token cost, plus a step's
fixed cost per chunk; only its own prefill if it may cut into the step in flight) exceeds the
target is refused with SLOUnattainableError naming both
numbers (HTTP 503), or with slo_admission="defer" queued as already late. TPOT targets order
resumed work but are not an admission test: whether a step stays under a TPOT depends on which
lower-priority work gets preempted, which is not known at arrival.

Step length: a step serves every running request one token, so its length is everyone's TPOT
that step, and a request arriving mid-step waits for it before its own prefill step. The sla
policy therefore sizes each step's token budget (StepCostModel) so the step fits within the
tightest TPOT target of the running requests and, with cut-in turned off
(cut_in_prefill_tokens=0), half the tightest TTFT target of any configured priority class
(arrival waits one step, then prefills in the next; before this sizing, 2,048-token steps of
batch prefill took ~1 s each and the mixed-priority benchmark's interactive p99 TTFT was
1.6 s). With cut-in on, an urgent arrival is prefilled at the next layer boundary, so only
TPOT bounds the step. A target that even a decode-only step misses does not throttle
prefill: it would be missed anyway.
"""

from __future__ import annotations

from collections import Counter

from tacit.scheduling.errors import SLOUnattainableError
from tacit.scheduling.policy import PriorityPolicy, SchedulerView, register_policy
from tacit.scheduling.request import Request

_ON_TIME, _NO_TARGET, _LATE = 0, 1, 2

__all__ = ["SLAPolicy", "SLOUnattainableError"]


@register_policy("sla")
class SLAPolicy(PriorityPolicy):
    def __init__(self) -> None:
        self._running_tpot: Counter[float] = Counter()  # TPOT targets of running requests

    def on_start(self, req: Request) -> None:
        if req.tpot_slo is not None:
            self._running_tpot[req.tpot_slo] += 1

    def on_stop(self, req: Request) -> None:
        if req.tpot_slo is not None:
            self._running_tpot[req.tpot_slo] -= 1
            if not self._running_tpot[req.tpot_slo]:
                del self._running_tpot[req.tpot_slo]

    def step_target_s(self, state: SchedulerView) -> float:
        """The longest a step may take: tightest running TPOT, and half the tightest class TTFT
        unless requests can cut into a step in flight (then an arrival does not wait it out)."""
        tpot = min(self._running_tpot, default=float("inf"))
        config = state.config
        if config.cut_in_prefill_tokens:
            return tpot
        ttft = min((c["ttft_ms"] / 1000 for c in config.slo_classes.values() if "ttft_ms" in c), default=float("inf"))
        return min(tpot, ttft / 2)

    def token_budget(self, max_num_batched_tokens: int, state: SchedulerView) -> int:
        s = state
        target = self.step_target_s(state)
        per_token = s.cost.prefill_s_per_token
        if target == float("inf") or per_token <= 0:
            return max_num_batched_tokens
        decodes = s.cost.step_s(0, s.num_running)
        if decodes >= target:
            # The target is missed whatever this step prefills: throttling prefill then only
            # costs throughput. Giving prefill half a decode step instead held the mixed-priority
            # benchmark's sla throughput at 0.82x fcfs while its goodput fell below priority's.
            return max_num_batched_tokens
        return max(1, min(max_num_batched_tokens, s.num_running + int((target - decodes) / per_token)))

    def _latest_start(self, req: Request, s: SchedulerView) -> float:
        remaining = s.uncached_tokens(req)  # a prefix-cache hit is not prefilled
        return req.next_token_deadline - s.cost.prefill_s(remaining, s.prefill_tokens_per_step, s.num_running)

    def waiting_key(self, req: Request, state: SchedulerView) -> tuple:
        # Priority class first: by slack alone, an interactive request that had just missed its
        # 500 ms TTFT went behind every batch job still inside its 60 s one, and waited 6.2 s
        # (the mixed-priority benchmark's p99). Within a class, least slack first.
        latest = self._latest_start(req, state)
        if latest == float("inf"):
            return (req.priority, _NO_TARGET, req.arrival_time, req.arrival_seq)
        if req.slo_deferred or latest < state.now:
            return (req.priority, _LATE, latest, req.arrival_seq)
        return (req.priority, _ON_TIME, latest, req.arrival_seq)

    def victim_key(self, req: Request) -> tuple:
        # Lowest class first, then whoever's next token is due latest (no target: never due).
        return (req.priority, req.next_token_deadline, req.arrival_time, req.arrival_seq)

    def arrival_class(self, req: Request) -> tuple | None:
        return None  # least slack first within a priority, not arrival

    def estimate_ttft(self, req: Request, s: SchedulerView) -> tuple[float, int]:
        """(seconds to its first token if it joined the queue now, prefill tokens queued ahead)."""
        if s.may_cut_in(req):
            # It will be prefilled at the next layer boundary of the step in flight, ahead of
            # the queue: without this, admission refused interactive requests at estimates of
            # 1.0-1.6 s that cut-in would have served in ~0.2 s (mixed-priority benchmark).
            return s.cost.step_s(req.num_tokens, 0), 0
        key = self.waiting_key(req, s)
        # Cached prefixes cost nothing: only the tokens the prefix cache does not hold are counted.
        ahead = sum(s.uncached_tokens(r) for r in s.waiting if self.waiting_key(r, s) < key)
        ahead += sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in s.running)
        total = ahead + s.uncached_tokens(req)
        return s.cost.prefill_s(total, s.prefill_tokens_per_step, s.num_running), ahead

    def admit(self, req: Request, state: SchedulerView) -> None:
        if req.ttft_slo is None:
            return
        est, ahead = self.estimate_ttft(req, state)
        if est <= req.ttft_slo:
            return
        s = state
        if s.config.slo_admission == "defer":
            req.slo_deferred = True
            return
        raise SLOUnattainableError(
            f"request {req.request_id} cannot meet its TTFT target ttft_slo_ms={req.ttft_slo * 1000:.0f}: the sla "
            f"policy estimates {est * 1000:.0f} ms to its first token ({req.num_tokens} prompt tokens plus {ahead} "
            f"queued ahead of it at {s.cost.prefill_s_per_token * 1000:.3f} ms/token measured, beside "
            f"{s.num_running} running requests); retry later, raise ttft_slo_ms, or run with "
            f"slo_admission='defer' to queue it anyway"
        )
