"""SchedulingPolicy: the order of the waiting queue and who gets preempted.

fcfs: arrival order; when blocks run out the newest running request is preempted.
priority: lower `priority` runs first (vLLM's convention), ties by arrival. A waiting request
that outranks a running one takes its place when blocks or batch slots (max_num_seqs) are
short; vLLM only preempts for blocks, so a full batch of low-priority work makes urgent
requests wait for a slot to drain.
sjf: priority first, then shortest predicted output first (OutputLengthPredictor): short
answers leave the batch sooner, so fewer requests wait behind long ones (mean latency).
sla: by slack against TTFT/TPOT targets, with admission control (tacit/scheduling/sla.py).

With the prefix cache, fcfs and priority serve the requests of one class (all; one priority) that
arrived in the same second longest cached prefix first (prefix_order.py, arrival_class).

Every policy but fcfs is bounded by the scheduler's aging rule (SchedulerConfig.aging_s): a
request that has waited that long goes ahead of all that have not, so none starves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from tacit.registry import Registry
from tacit.scheduling.request import Request

if TYPE_CHECKING:
    from tacit.config import SchedulerConfig
    from tacit.scheduling.cost_model import StepCostModel


class SchedulerView:
    """What a policy may read of the scheduler, and nothing it can change: the clock, the queues
    (as tuples), the measured step costs and the configuration. The scheduler passes one to
    every hook that needs more than the request at hand."""

    __slots__ = ("_scheduler",)

    def __init__(self, scheduler) -> None:  # a Scheduler; not typed to keep this module below it
        self._scheduler = scheduler

    @property
    def now(self) -> float:
        return self._scheduler.now

    @property
    def config(self) -> "SchedulerConfig":
        return self._scheduler.config

    @property
    def cost(self) -> "StepCostModel":
        return self._scheduler.cost

    @property
    def waiting(self) -> tuple[Request, ...]:
        return tuple(self._scheduler.waiting)

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(self._scheduler.running)

    @property
    def num_running(self) -> int:
        return len(self._scheduler.running)

    @property
    def prefill_tokens_per_step(self) -> int:
        return self._scheduler.prefill_tokens_per_step

    def may_cut_in(self, req: Request) -> bool:
        return self._scheduler.may_cut_in(req)

    def uncached_tokens(self, req: Request) -> int:
        """Tokens req has left to prefill, less what the prefix cache holds of it."""
        return self._scheduler.uncached_tokens(req)


class SchedulingPolicy(ABC):
    name: str

    def admit(self, req: Request, state: SchedulerView) -> None:
        """Raise (a ValueError naming the reason) to refuse a request as it arrives."""

    def on_start(self, req: Request) -> None:
        """req joined the running set (for policies that keep running aggregates)."""

    def on_stop(self, req: Request) -> None:
        """req left the running set: preempted, finished or aborted."""

    def token_budget(self, max_num_batched_tokens: int, state: SchedulerView) -> int:
        """Tokens this step may compute."""
        return max_num_batched_tokens

    @abstractmethod
    def waiting_key(self, req: Request, state: SchedulerView) -> tuple:
        """Smaller runs first."""

    def pick_victim(self, candidates: list[Request]) -> Request:
        """The request to preempt among candidates (running, not yet scheduled this step)."""
        return max(candidates, key=self.victim_key)

    @abstractmethod
    def victim_key(self, req: Request) -> tuple:
        """Larger is preempted first."""

    def victim_class(self, req: Request) -> tuple:
        """The leading part of victim_key no other consideration may cross (priority, for the
        policies that have it): preemption for blocks may pass over the policy's victim when it
        frees none, for one in the same class that frees some (preemption.pick_victim_for_blocks),
        never for one in another."""
        return ()

    def arrival_class(self, req: Request) -> tuple | None:
        """The part of waiting_key ahead of arrival order (fcfs: nothing; priority: the
        priority): requests of one class are served by arrival, and cache-aware scheduling may
        put those with a longer cached prefix first among them (prefix_order.py). None for a
        policy whose order within a class is its own (sjf: predicted length; sla: slack)."""
        return None

    def outranks(self, waiting: Request, running: Request) -> bool:
        """May `waiting` preempt `running` to get in? FCFS never lets a newcomer preempt."""
        return False


# name -> policy class; filled by @register_policy as each policy module is imported
# (tacit/scheduling/__init__.py imports them all).
POLICIES = Registry("scheduling_policy")
register_policy = POLICIES.register


def get_policy(name: str) -> SchedulingPolicy:
    return POLICIES.lookup(name)()


@register_policy("fcfs")
class FCFSPolicy(SchedulingPolicy):
    def waiting_key(self, req: Request, state: SchedulerView) -> tuple:
        # Preempted requests come back ahead of everything that arrived after them.
        return (req.arrival_time, req.arrival_seq)

    def victim_key(self, req: Request) -> tuple:
        return (req.arrival_time, req.arrival_seq)

    def arrival_class(self, req: Request) -> tuple | None:
        return ()


@register_policy("priority")
class PriorityPolicy(SchedulingPolicy):
    def waiting_key(self, req: Request, state: SchedulerView) -> tuple:
        return (req.priority, req.arrival_time, req.arrival_seq)

    def victim_key(self, req: Request) -> tuple:
        return (req.priority, req.arrival_time, req.arrival_seq)

    def victim_class(self, req: Request) -> tuple:
        return (req.priority,)

    def arrival_class(self, req: Request) -> tuple | None:
        return (req.priority,)

    def outranks(self, waiting: Request, running: Request) -> bool:
        return waiting.priority < running.priority


def predicted_remaining(req: Request) -> int:
    predicted = req.predicted_output_tokens if req.predicted_output_tokens is not None else req.max_tokens
    return max(predicted - len(req.output_token_ids), 1)


@register_policy("sjf")
class SJFPolicy(PriorityPolicy):
    def waiting_key(self, req: Request, state: SchedulerView) -> tuple:
        return (req.priority, predicted_remaining(req), req.arrival_time, req.arrival_seq)

    def victim_key(self, req: Request) -> tuple:
        return (req.priority, predicted_remaining(req), req.arrival_time, req.arrival_seq)

    def arrival_class(self, req: Request) -> tuple | None:
        return None  # shortest predicted output first within a priority, not arrival
