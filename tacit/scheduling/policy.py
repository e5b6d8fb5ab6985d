"""SchedulingPolicy: the order of the waiting queue and who gets preempted.

fcfs: arrival order; when blocks run out the newest running request is preempted.
priority: lower `priority` runs first (vLLM's convention), ties by arrival. A waiting request
that outranks a running one takes its place when blocks or batch slots (max_num_seqs) are
short; vLLM only preempts for blocks, so a full batch of low-priority work makes urgent
requests wait for a slot to drain.
sjf: priority first, then shortest predicted output first (OutputLengthPredictor): short
answers leave the batch sooner, so fewer requests wait behind long ones (mean latency).
sla: by slack against TTFT/TPOT targets, with admission control (tacit/scheduling/sla.py).

Every policy but fcfs is bounded by the scheduler's aging rule (SchedulerConfig.aging_s): a
request that has waited that long goes ahead of all that have not, so none starves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from tacit.scheduling.request import Request

if TYPE_CHECKING:
    from tacit.scheduling.scheduler import Scheduler


class SchedulingPolicy(ABC):
    name: str
    scheduler: "Scheduler"

    def bind(self, scheduler: "Scheduler") -> None:
        """The scheduler whose clock, cost model and queues the policy may read."""
        self.scheduler = scheduler

    def admit(self, req: Request) -> None:
        """Raise (a ValueError naming the reason) to refuse a request as it arrives."""

    def on_start(self, req: Request) -> None:
        """req joined the running set (for policies that keep running aggregates)."""

    def on_stop(self, req: Request) -> None:
        """req left the running set: preempted, finished or aborted."""

    def token_budget(self, max_num_batched_tokens: int) -> int:
        """Tokens this step may compute."""
        return max_num_batched_tokens

    @abstractmethod
    def waiting_key(self, req: Request) -> tuple:
        """Smaller runs first."""

    def pick_victim(self, candidates: list[Request]) -> Request:
        """The request to preempt among candidates (running, not yet scheduled this step)."""
        return max(candidates, key=self.victim_key)

    @abstractmethod
    def victim_key(self, req: Request) -> tuple:
        """Larger is preempted first."""

    def outranks(self, waiting: Request, running: Request) -> bool:
        """May `waiting` preempt `running` to get in? FCFS never lets a newcomer preempt."""
        return False


class FCFSPolicy(SchedulingPolicy):
    name = "fcfs"

    def waiting_key(self, req: Request) -> tuple:
        # Preempted requests come back ahead of everything that arrived after them.
        return (req.arrival_time, req.arrival_seq)

    def victim_key(self, req: Request) -> tuple:
        return (req.arrival_time, req.arrival_seq)


class PriorityPolicy(SchedulingPolicy):
    name = "priority"

    def waiting_key(self, req: Request) -> tuple:
        return (req.priority, req.arrival_time, req.arrival_seq)

    def victim_key(self, req: Request) -> tuple:
        return (req.priority, req.arrival_time, req.arrival_seq)

    def outranks(self, waiting: Request, running: Request) -> bool:
        return waiting.priority < running.priority


def predicted_remaining(req: Request) -> int:
    return max(req.predicted_output_tokens - len(req.output_token_ids), 1)


class SJFPolicy(PriorityPolicy):
    name = "sjf"

    def waiting_key(self, req: Request) -> tuple:
        return (req.priority, predicted_remaining(req), req.arrival_time, req.arrival_seq)

    def victim_key(self, req: Request) -> tuple:
        return (req.priority, predicted_remaining(req), req.arrival_time, req.arrival_seq)


POLICIES = ("fcfs", "priority", "sjf", "sla")


def get_policy(name: str) -> SchedulingPolicy:
    from tacit.scheduling.sla import SLAPolicy

    classes: dict[str, type[SchedulingPolicy]] = {"fcfs": FCFSPolicy, "priority": PriorityPolicy, "sjf": SJFPolicy,
                                                  "sla": SLAPolicy}
    if name not in classes:
        raise ValueError(f"scheduling_policy={name!r} is not known; valid: {', '.join(POLICIES)}")
    return classes[name]()
