"""Scheduler: continuous batching under a token budget, in vLLM v1's model.

Each step spends at most max_num_batched_tokens: running requests first (one token for a
decode, a chunk for a prefill still in progress), then waiting requests in the policy's
order. Prefill chunks and decodes share one forward pass. No request prefills more than
long_prefill_token_threshold tokens a step and at most max_long_partial_prefills such long
prompts prefill in one step (shorter ones may pass them), so long prompts are spread over
several steps instead of stalling every decode in one. When the KV pool runs dry the policy's
victim (FCFS: the newest running request) is preempted: its blocks are freed, and either its
KV is swapped to host memory and copied back on resume, or it is recomputed from its prompt
plus the tokens it already produced, whichever the measured costs say is cheaper
(tacit/memory/swap.py). Either way its output is exactly what it would have been. A policy may
also size each step's token budget (sla does, from the measured step costs).

Cut-in: a step of 64 loaded sequences takes ~200 ms on the default model, so a request arriving
just after it started would wait that long before its own prefill even begins. The online
engine therefore asks schedule_cut_in() between two layers of the step in flight; a fresh
waiting request that outranks someone in that step and whose whole prompt fits
cut_in_prefill_tokens is prefilled there and then, and joins the running set (the next
schedule() preempts back down to max_num_seqs if the cut-in went over it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from tacit.config import SchedulerConfig
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.memory.swap import KVSwapper
from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.policy import FCFSPolicy, SchedulingPolicy
from tacit.scheduling.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, num_new_tokens)
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, policy: SchedulingPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.kv = kv
        self.policy = policy or FCFSPolicy()
        self.clock = clock
        self.now = clock()
        self.cost = StepCostModel()  # the engine feeds it every step's measured time
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.swapper: KVSwapper | None = None  # the engine sets it when swap_space > 0
        self.policy.bind(self)

    @property
    def prefill_tokens_per_step(self) -> int:
        """What one step has left for prefill beside the running decodes."""
        return max(1, self.config.max_num_batched_tokens - len(self.running))

    def add_request(self, request: Request) -> None:
        self.now = self.clock()
        self.policy.admit(request)  # raises to refuse, before anything is queued
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _should_swap(self, request: Request, num_blocks: int) -> bool:
        mode = self.config.preemption_mode
        if self.swapper is None or mode == "recompute" or not num_blocks or not self.swapper.has_room(num_blocks):
            return False  # "swap" with the swap space full falls back to recompute
        return mode == "swap" or (self.swapper.cost_s(num_blocks)
                                  < request.num_computed_tokens * self.cost.prefill_s_per_token)

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        self.policy.on_stop(request)
        num_blocks = self.kv.blocks_needed(request.num_computed_tokens)
        if self._should_swap(request, num_blocks):
            # Before the blocks are freed: this same schedule() may hand them to someone else.
            self.swapper.swap_out(request.request_id, self.kv.block_tables[request.request_id][:num_blocks])
        else:
            request.num_computed_tokens = 0
        self.kv.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(request)
        out.preempted.append(request)

    def _waiting_key(self, req: Request) -> tuple:
        # Aged requests first (FCFS among them), then the policy's order.
        aging = self.config.aging_s
        if not req.aged and aging is not None and self.now - req.arrival_time >= aging:
            req.aged = True
        if req.aged:
            return (0, req.arrival_time, req.arrival_seq)
        return (1, *self.policy.waiting_key(req))

    def _next_waiting(self, short_only: bool = False) -> Request | None:
        pool = [r for r in self.waiting if not self._is_long(r)] if short_only else self.waiting
        return min(pool, key=self._waiting_key) if pool else None

    def _is_long(self, req: Request) -> bool:
        cap = self.config.long_prefill_token_threshold
        return bool(cap) and req.num_tokens - req.num_computed_tokens > cap

    def _outranks(self, waiting: Request, running: Request) -> bool:
        if running.aged:
            return False  # the aging bound: once it has aged and got in, nothing pushes it out
        return self.policy.outranks(waiting, running)

    def _pick_victim(self, candidates: list[Request]) -> Request:
        fresh = [r for r in candidates if not r.aged]
        return self.policy.pick_victim(fresh or candidates)

    def _make_room_for_urgent(self, out: SchedulerOutput) -> None:
        """Preempt lower-ranked running work so the best waiting request can start this step."""
        if not self.waiting or not self.running:
            return
        head = self._next_waiting()
        need = self.kv.blocks_needed(head.num_computed_tokens + self._chunk(head, self.config.max_num_batched_tokens))
        outranked = [r for r in self.running if self._outranks(head, r)]
        reclaimable = sum(len(self.kv.block_tables.get(r.request_id, [])) for r in outranked)
        if not outranked or self.kv.pool.num_free_blocks + reclaimable < need:
            return  # preempting would not let it in: do not throw away their work for nothing
        while True:
            short_of_slots = len(self.running) >= self.config.max_num_seqs
            short_of_blocks = need > self.kv.pool.num_free_blocks
            if not (short_of_slots or short_of_blocks) or not outranked:
                return
            victim = self._pick_victim(outranked)
            outranked.remove(victim)
            self._preempt(victim, out)

    def _chunk(self, req: Request, budget: int) -> int:
        """Tokens req may compute this step: all it has left, capped by the budget and the
        per-request long-prefill threshold (0 means no cap)."""
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        cap = self.config.long_prefill_token_threshold
        return min(n, cap) if cap and self.config.enable_chunked_prefill else n

    def _start(self, req: Request, n: int, out: SchedulerOutput) -> None:
        self.waiting.remove(req)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self.policy.on_start(req)
        out.scheduled.append((req, n))

    def may_cut_in(self, req: Request) -> bool:
        """Would req be prefilled inside the step in flight if it arrived now (blocks allowing)?"""
        return (0 < req.num_tokens <= self.config.cut_in_prefill_tokens and not req.num_computed_tokens
                and not req.num_preemptions and any(self._outranks(req, r) for r in self.running))

    def schedule_cut_in(self) -> SchedulerOutput:
        """Requests to prefill now, between two layers of the step in flight (which is why
        only fresh ones qualify: a preempted request's blocks may be swapped or half-computed)."""
        out = SchedulerOutput()
        budget = self.config.cut_in_prefill_tokens
        if not budget or not self.running or not self.waiting:
            return out
        self.now = self.clock()
        for req in sorted(self.waiting, key=self._waiting_key):
            n = req.num_tokens
            if n > budget or not self.may_cut_in(req):
                continue
            if not self.kv.allocate_slots(req.request_id, 0, n):
                break
            self._start(req, n, out)
            budget -= n
        return out

    def _trim_running(self, out: SchedulerOutput) -> None:
        """Cut-ins join the running set even when it is full; preempt back to max_num_seqs."""
        while len(self.running) > self.config.max_num_seqs:
            self._preempt(self._pick_victim(self.running), out)

    def schedule(self) -> SchedulerOutput:
        self.now = self.clock()
        out = SchedulerOutput()
        budget = self.policy.token_budget(self.config.max_num_batched_tokens)
        chunked = self.config.enable_chunked_prefill
        self._trim_running(out)
        self._make_room_for_urgent(out)
        urgent_preemption = bool(out.preempted)
        # Long prompts prefilling this step: at most max_long_partial_prefills of them, so a burst
        # of long prompts cannot fill the whole token budget between two decodes.
        long_slots = self.config.max_long_partial_prefills

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, budget)
            long = self._is_long(req)
            if (not chunked and n < req.num_tokens - req.num_computed_tokens) or (long and not long_slots):
                i += 1
                continue
            long_slots -= long
            scheduled = True
            while not self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n):
                # Only requests not yet given slots this step are candidates (they sit at i and after).
                victim = self._pick_victim(self.running[i:])
                self._preempt(victim, out)
                if victim is req:
                    scheduled = False
                    break
            if scheduled:
                out.scheduled.append((req, n))
                budget -= n
                i += 1

        # Admitting new work in a step that ran out of blocks would just thrash the pool; after
        # a priority preemption, admitting is the point.
        while (self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs
               and (urgent_preemption or not out.preempted)):
            req = self._next_waiting(short_only=not long_slots)
            if req is None:
                break
            n = self._chunk(req, budget)
            long = self._is_long(req)
            if n < req.num_tokens - req.num_computed_tokens and not chunked:
                break
            if not self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n):
                break
            if self.swapper is not None and self.swapper.holds(req.request_id):
                self.swapper.swap_in(req.request_id, self.kv.block_tables[req.request_id])
            self._start(req, n, out)
            budget -= n
            long_slots -= long
        return out

    def finish(self, request: Request) -> None:
        """Drop a finished or aborted request and give its blocks back at once."""
        if request in self.running:
            self.running.remove(request)
            self.policy.on_stop(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request.request_id)
        if self.swapper is not None:
            self.swapper.drop(request.request_id)
