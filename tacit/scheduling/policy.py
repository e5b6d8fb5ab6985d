"""SchedulingPolicy: the order of the waiting queue and who gets preempted.

fcfs: arrival order; when blocks run out the newest running request is preempted.
priority: lower `priority` runs first (vLLM's convention), ties by arrival. A waiting request
that outranks a running one takes its place when blocks or batch slots (max_num_seqs) are
short; vLLM only preempts for blocks, so a full batch of low-priority work makes urgent
requests wait for a slot to drain.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from tacit.scheduling.request import Request


class SchedulingPolicy(ABC):
    name: str

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


POLICIES: dict[str, type[SchedulingPolicy]] = {"fcfs": FCFSPolicy, "priority": PriorityPolicy}


def get_policy(name: str) -> SchedulingPolicy:
    if name not in POLICIES:
        raise ValueError(f"scheduling_policy={name!r} is not known; valid: {', '.join(POLICIES)}")
    return POLICIES[name]()
