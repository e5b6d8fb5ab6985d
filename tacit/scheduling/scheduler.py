"""Scheduler: continuous batching under a token budget, in vLLM v1's model.

Each step spends at most max_num_batched_tokens: running requests first (one token for a
decode, a chunk for a prefill still in progress), then waiting requests in arrival order.
Prefill chunks and decodes share one forward pass. When the KV pool runs dry the newest
running request is preempted: its blocks are freed and it is recomputed later from its
prompt plus the tokens it already produced, so its output is exactly what it would have been.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tacit.config import SchedulerConfig
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.scheduling.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, num_new_tokens)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request.request_id)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        chunked = self.config.enable_chunked_prefill

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not chunked and n < req.num_tokens - req.num_computed_tokens:
                i += 1
                continue
            while not self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                out.scheduled.append((req, n))
                budget -= n
                i += 1
                continue
            break  # req itself was preempted; everything after it already was too

        # Admitting new work in a step that had to preempt would just thrash the pool.
        while not out.preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            n = req.num_tokens - req.num_computed_tokens
            if n > budget:
                if not chunked:
                    break
                n = budget
            if not self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n):
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append((req, n))
            budget -= n
        return out

    def finish(self, request: Request) -> None:
        """Drop a finished or aborted request and give its blocks back at once."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request.request_id)
