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

One step, in vLLM v1's contract: schedule() -> SchedulerOutput (plain data) -> the model runner
-> ModelRunnerOutput -> update_from_output(), the one place that advances num_computed_tokens,
appends sampled tokens, times first tokens, checks EOS / stop ids / max_tokens and frees the
blocks of whatever finished. Detokenization and stop strings are the output processor's.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from tacit.config import SchedulerConfig
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.memory.swap import SwapSpace
from tacit.outputs import ModelRunnerOutput
from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.length_predictor import OutputLengthPredictor
from tacit.scheduling.policy import FCFSPolicy, SchedulerView, SchedulingPolicy
from tacit.scheduling.request import Request, RequestStatus
from tacit.scheduling.scheduler_output import (
    CachedRequestData,
    EngineCoreOutput,
    NewRequestData,
    SchedulerOutput,
    SchedulerStats,
    samples_this_step,
)
from tacit.scheduling.step_budget import StepBudget
from tacit.structured_output import StructuredOutputManager


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        policy: SchedulingPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        swapper: SwapSpace | None = None,
        eos_token_ids: Iterable[int] = (),
        structured_output: StructuredOutputManager | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.policy = policy or FCFSPolicy()
        self.clock = clock
        self.now = clock()
        self.cost = StepCostModel()  # learns every step's measured time (update_from_output)
        self.predictor = OutputLengthPredictor()  # learns every finished request's length
        self.swapper = swapper  # None: preemption always recomputes
        self.eos_token_ids = frozenset(eos_token_ids)
        # Matchers of the requests with a grammar (None: this scheduler refuses them).
        self.structured_output = structured_output
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_cut_ins = 0
        self._finished_req_ids: list[str] = []  # for the runner, with the next SchedulerOutput
        self.view = SchedulerView(self)

    @property
    def prefill_tokens_per_step(self) -> int:
        """What one step has left for prefill beside the running decodes."""
        return max(1, self.config.max_num_batched_tokens - len(self.running))

    def add_request(self, request: Request) -> None:
        """Queue a request; the policy may refuse it (raising) before anything is queued."""
        self.now = self.clock()
        if request.predicted_output_tokens is None:
            p = request.params
            request.predicted_output_tokens = self.predictor.predict(
                request.num_prompt_tokens, request.max_tokens, p.temperature, p.expected_output_tokens
            )
        self.policy.admit(request, self.view)
        spec = request.params.structured_outputs
        if spec is not None:
            if self.structured_output is None:
                raise ValueError("structured_outputs needs a StructuredOutputManager; this scheduler has none")
            self.structured_output.add_request(request.request_id, spec)
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def _should_swap(self, request: Request, num_blocks: int) -> bool:
        mode = self.config.preemption_mode
        if self.swapper is None or mode == "recompute" or not num_blocks or not self.swapper.has_room(num_blocks):
            return False  # "swap" with the swap space full falls back to recompute
        return mode == "swap" or (
            self.swapper.cost_s(num_blocks) < request.num_computed_tokens * self.cost.prefill_s_per_token
        )

    def _preempt(self, request: Request, preempted: list[Request]) -> None:
        self.running.remove(request)
        self.policy.on_stop(request)
        num_blocks = self.kv.blocks_needed(request.num_computed_tokens)
        if self._should_swap(request, num_blocks):
            # Before the blocks are freed: this same schedule() may hand them to someone else.
            self.swapper.swap_out(request.request_id, self.kv.get_block_ids(request.request_id)[:num_blocks])
        else:
            request.num_computed_tokens = 0
        self.kv.free(request.request_id)
        request.spec_token_ids = []
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(request)
        preempted.append(request)

    def _waiting_key(self, req: Request) -> tuple:
        # Aged requests first (FCFS among them), then the policy's order.
        aging = self.config.aging_s
        if not req.aged and aging is not None and self.now - req.arrival_time >= aging:
            req.aged = True
        if req.aged:
            return (0, req.arrival_time, req.arrival_seq)
        return (1, *self.policy.waiting_key(req, self.view))

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

    def _make_room_for_urgent(self, preempted: list[Request]) -> None:
        """Preempt lower-ranked running work so the best waiting request can start this step."""
        if not self.waiting or not self.running:
            return
        head = self._next_waiting()
        need = self.kv.blocks_needed(head.num_computed_tokens + self._chunk(head, self.config.max_num_batched_tokens))
        outranked = [r for r in self.running if self._outranks(head, r)]
        reclaimable = sum(self.kv.num_blocks_of(r.request_id) for r in outranked)
        if not outranked or self.kv.num_free_blocks + reclaimable < need:
            return  # preempting would not let it in: do not throw away their work for nothing
        while True:
            short_of_slots = len(self.running) >= self.config.max_num_seqs
            short_of_blocks = need > self.kv.num_free_blocks
            if not (short_of_slots or short_of_blocks) or not outranked:
                return
            victim = self._pick_victim(outranked)
            outranked.remove(victim)
            self._preempt(victim, preempted)

    def _chunk(self, req: Request, budget: int) -> int:
        """Tokens req may compute this step: all it has left, capped by the budget and the
        per-request long-prefill threshold (0 means no cap)."""
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        cap = self.config.long_prefill_token_threshold
        return min(n, cap) if cap and self.config.enable_chunked_prefill else n

    def _place(self, req: Request, budget: StepBudget, long: bool) -> int:
        """The pool (data-parallel attention's rank) of a request about to be scheduled: one not
        yet holding blocks goes to a pool with a long-prefill slot left if it is long, then the
        most of this step's budget left, then the most free blocks."""
        kv, rid = self.kv, req.request_id
        if kv.num_pools > 1 and not kv.num_blocks_of(rid):
            kv.place(
                rid,
                max(
                    range(kv.num_pools),
                    key=lambda p: (long and budget.long_left[p] > 0, budget.of(p), kv.num_free_blocks_in(p), -p),
                ),
            )
        return kv.pool_of(rid)

    def _start(self, req: Request) -> None:
        self.waiting.remove(req)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self.policy.on_start(req)

    def _output(
        self,
        scheduled: list[tuple[Request, int, list[int] | None]],
        preempted: list[Request],
        drafts: dict[str, list[int]] | None = None,
    ) -> SchedulerOutput:
        """The step as plain data; new_blocks None marks a request the runner gets whole."""
        out = SchedulerOutput(
            preempted_req_ids=[r.request_id for r in preempted],
            finished_req_ids=self._finished_req_ids,
            scheduled_spec_decode_tokens=drafts or {},
        )
        self._finished_req_ids = []
        if self.swapper is not None:
            out.swap_ops = self.swapper.take_ops()
        for req, n, new_blocks in scheduled:
            out.num_scheduled_tokens[req.request_id] = n
            if new_blocks is None:
                out.scheduled_new_reqs.append(
                    NewRequestData(
                        req.request_id,
                        list(req.prompt_token_ids),
                        list(req.output_token_ids),
                        req.params,
                        self.kv.get_block_ids(req.request_id),
                        req.num_computed_tokens,
                        self.kv.pool_of(req.request_id),
                    )
                )
            else:
                out.scheduled_cached_reqs.append(CachedRequestData(req.request_id, new_blocks, req.num_computed_tokens))
        so = self.structured_output
        if so:  # no constrained request anywhere: no loop, no mask
            # Only rows that sample this step (brought level with all their tokens) need a mask;
            # a constrained request is never given drafts (_drafts_to_verify).
            ids = [
                r.request_id
                for r, n, _ in scheduled
                if r.request_id in so and samples_this_step(r.num_computed_tokens, n, r.num_tokens, r.params)
            ]
            if ids:
                out.structured_output_request_ids = ids
                out.grammar_bitmask = so.grammar_bitmask(ids)
        return out

    def may_cut_in(self, req: Request) -> bool:
        """Would req be prefilled inside the step in flight if it arrived now (blocks allowing)?"""
        return (
            0 < req.num_tokens <= self.config.cut_in_prefill_tokens
            and not req.num_computed_tokens
            and not req.num_preemptions
            and any(self._outranks(req, r) for r in self.running)
        )

    def schedule_cut_in(self) -> SchedulerOutput:
        """Requests to prefill now, between two layers of the step in flight (which is why
        only fresh ones qualify: a preempted request's blocks may be swapped or half-computed)."""
        scheduled: list[tuple[Request, int, list[int] | None]] = []
        budget = self.config.cut_in_prefill_tokens
        if not budget or not self.running or not self.waiting:
            return self._output(scheduled, [])
        self.now = self.clock()
        for req in sorted(self.waiting, key=self._waiting_key):
            n = req.num_tokens
            if n > budget or not self.may_cut_in(req):
                continue
            if self.kv.allocate_slots(req.request_id, 0, n) is None:
                break
            self._start(req)
            scheduled.append((req, n, None))
            budget -= n
        self.num_cut_ins += len(scheduled)
        return self._output(scheduled, [])

    def _trim_running(self, preempted: list[Request]) -> None:
        """Cut-ins join the running set even when it is full; preempt back to max_num_seqs."""
        while len(self.running) > self.config.max_num_seqs:
            self._preempt(self._pick_victim(self.running), preempted)

    def _drafts_to_verify(self, req: Request, budget: int) -> list[int]:
        """The draft tokens req's step verifies: only while it decodes (one token left to
        compute), as many as the step's budget has room for past that token, and no more than
        could be kept before max_tokens (which also keeps every position within max_model_len).
        None for a request under a grammar: its bitmask covers the one position that samples
        now, and masking each draft position would need the matcher advanced over the drafts."""
        drafts = req.spec_token_ids
        if not drafts or req.num_tokens - req.num_computed_tokens != 1:
            return []
        if self.structured_output is not None and req.request_id in self.structured_output:
            return []
        room = min(budget - 1, req.max_tokens - len(req.output_token_ids) - 1)
        return drafts[: max(room, 0)]

    def schedule(self) -> SchedulerOutput:
        self.now = self.clock()
        scheduled: list[tuple[Request, int, list[int] | None]] = []
        preempted: list[Request] = []
        drafts: dict[str, list[int]] = {}
        # Long prompts prefilling this step: at most max_long_partial_prefills of them (a pool), so
        # a burst of long prompts cannot fill the whole token budget between two decodes.
        budget = StepBudget(
            self.policy.token_budget(self.config.max_num_batched_tokens, self.view),
            self.kv.num_pools,
            self.config.max_long_partial_prefills,
        )
        chunked = self.config.enable_chunked_prefill
        self._trim_running(preempted)
        self._make_room_for_urgent(preempted)
        urgent_preemption = bool(preempted)

        i = 0
        while i < len(self.running) and budget.total > 0:
            req = self.running[i]
            pool = self.kv.pool_of(req.request_id)
            n = self._chunk(req, budget.of(pool))
            verify = self._drafts_to_verify(req, budget.of(pool))
            n += len(verify)  # draft tokens are computed (their KV written) like any scheduled token
            long = self._is_long(req)
            if (
                not n
                or (not chunked and n < req.num_tokens - req.num_computed_tokens)
                or (long and not budget.take_long_slot(pool))
            ):
                i += 1
                continue
            new_blocks = self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n)
            while new_blocks is None:
                # Only requests not yet given slots this step are candidates (they sit at i and
                # after), and only those whose blocks share req's pool (data-parallel attention).
                victim = self._pick_victim(
                    [r for r in self.running[i:] if self.kv.same_pool(r.request_id, req.request_id)]
                )
                self._preempt(victim, preempted)
                if victim is req:
                    break
                new_blocks = self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n)
            if new_blocks is not None:
                scheduled.append((req, n, new_blocks))
                if verify:
                    drafts[req.request_id] = verify
                budget.spend(pool, n)
                i += 1

        # Admitting new work in a step that ran out of blocks would just thrash the pool; after
        # a priority preemption, admitting is the point.
        while (
            self.waiting
            and budget.total > 0
            and len(self.running) < self.config.max_num_seqs
            and (urgent_preemption or not preempted)
        ):
            req = self._next_waiting(short_only=not budget.any_long_slot)
            if req is None:
                break
            long = self._is_long(req)
            pool = self._place(req, budget, long)
            n = self._chunk(req, budget.of(pool))
            if not n or (n < req.num_tokens - req.num_computed_tokens and not chunked):
                break
            if long and not budget.take_long_slot(pool):
                break
            if self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n) is None:
                break
            if self.swapper is not None and self.swapper.holds(req.request_id):
                self.swapper.swap_in(req.request_id, self.kv.get_block_ids(req.request_id))
            self._start(req)
            scheduled.append((req, n, None))
            budget.spend(pool, n)
        return self._output(scheduled, preempted, drafts)

    # ---- after the step ---------------------------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Advance every scheduled request by the tokens it computed (less the draft tokens its
        verify step rejected), append what was sampled, finish (and free) requests that hit
        EOS, a stop token id or max_tokens (0: at the end of the prefill), pass on the prompt
        logprobs the runner scored and keep the proposer's drafts for the next step."""
        if self.swapper is not None:
            self.swapper.observe(runner_output.swap_blocks, runner_output.swap_s)
        verified = scheduler_output.scheduled_spec_decode_tokens
        prefill_tokens = decodes = 0
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            req = self.requests.get(req_id)
            if req is not None:
                req.num_computed_tokens += n
                req.spec_token_ids = []
            num_drafts = len(verified.get(req_id, ()))
            if n - num_drafts == 1:
                decodes += 1
            # A verify step's drafts cost what prompt tokens do: more rows through every GEMM.
            prefill_tokens += n if n - num_drafts > 1 else num_drafts
        self.cost.observe(prefill_tokens, decodes, runner_output.execute_s)
        now = self.clock()
        outputs = []
        scored = runner_output.prompt_logprobs
        sampled = set(runner_output.req_ids)
        for req_id, tokens, logprobs in zip(
            runner_output.req_ids, runner_output.sampled_token_ids, runner_output.logprobs
        ):
            req = self.requests.get(req_id)
            if req is None or req.is_finished:
                continue  # aborted while its step ran
            # Rejected drafts: their KV slots lie past every kept token and are written over by
            # the tokens that take their positions; the blocks stay the request's.
            req.num_computed_tokens -= len(verified.get(req_id, ())) + 1 - len(tokens)
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            new, reason, stop_reason = self._append_tokens(req, tokens)
            if reason is not None:
                self.finish_request(req_id, reason, stop_reason)
            kept = None if logprobs is None else logprobs[: len(new)]
            outputs.append(EngineCoreOutput(req_id, new, kept, reason, stop_reason, scored.get(req_id)))
        for req_id, drafts in runner_output.draft_token_ids.items():
            req = self.requests.get(req_id)
            if req is not None and req.status == RequestStatus.RUNNING:
                req.spec_token_ids = list(drafts)
        # News without a token: prompt tokens a chunk scored mid-prefill, and a prompt that was
        # only to be scored (max_tokens=0) ending with its prefill.
        for req_id in scheduler_output.num_scheduled_tokens:
            req = self.requests.get(req_id)
            if req_id in sampled or req is None or req.is_finished:
                continue
            reason = None
            if req.max_tokens == 0 and req.num_computed_tokens >= req.num_tokens:
                reason = "length"
                self.finish_request(req_id, reason)
            if reason is not None or req_id in scored:
                outputs.append(EngineCoreOutput(req_id, [], None, reason, None, scored.get(req_id)))
        return outputs

    def _append_tokens(self, req: Request, tokens: list[int]) -> tuple[list[int], str | None, int | str | None]:
        """Append a step's tokens one at a time, each checked as if it came alone: the tokens
        kept (up to the one that ended the request), the finish reason and the stop reason."""
        so = self.structured_output
        for k, token in enumerate(tokens):
            req.append_output_token(token)
            grammar_ended = bool(so) and so.accept_token(req.request_id, token)
            reason, stop_reason = self._check_stop(req, token)
            if reason is None and grammar_ended:
                reason = "stop"  # the grammar is complete (or refused the token): nothing valid can follow
            if reason is not None:
                return tokens[: k + 1], reason, stop_reason
        return tokens, None, None

    def _check_stop(self, req: Request, token: int) -> tuple[str | None, int | None]:
        p = req.params
        n_out = len(req.output_token_ids)
        if n_out >= p.min_tokens and ((not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids):
            return "stop", token
        if n_out >= req.max_tokens:
            return "length", None
        return None, None

    def finish_request(self, request_id: str, reason: str, stop_reason: int | str | None = None) -> None:
        """End a request (finished, stopped by a stop string, or aborted) and give its blocks
        back at once; the runner drops its state with the next SchedulerOutput."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        if not req.is_finished:
            req.finish(reason, stop_reason)
        if req in self.running:
            self.running.remove(req)
            self.policy.on_stop(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(request_id)
        if self.swapper is not None:
            self.swapper.drop(request_id)
        if self.structured_output is not None:
            self.structured_output.remove_request(request_id)
        self._finished_req_ids.append(request_id)
        # An abort says nothing about how long it would have run, nor a prompt only scored.
        if reason in ("stop", "length") and req.max_tokens > 0:
            p = req.params
            self.predictor.observe(
                req.num_prompt_tokens,
                req.max_tokens,
                p.temperature,
                p.expected_output_tokens,
                req.predicted_output_tokens,
                len(req.output_token_ids),
            )

    def make_stats(self) -> SchedulerStats:
        swap = self.swapper
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_free=self.kv.num_free_blocks,
            num_preemptions=self.num_preemptions,
            num_swapped_out=swap.num_swapped_out if swap else 0,
            num_swapped_in=swap.num_swapped_in if swap else 0,
            swap_blocks_used=swap.used_blocks if swap else 0,
            num_cut_ins=self.num_cut_ins,
            length_predictor_mae=self.predictor.mean_abs_error or 0.0,
            length_predictor_scored=self.predictor.num_scored,
        )
