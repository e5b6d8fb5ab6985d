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

Cut-in (cut_in.py): between two layers of a step in flight the online engine may prefill a
fresh short request that outranks someone in that step, rather than make it wait ~200 ms for
the step to end.

One step, in vLLM v1's contract: schedule() -> SchedulerOutput (plain data) -> the model runner
-> ModelRunnerOutput -> update_from_output(), the one place that advances num_computed_tokens,
appends sampled tokens, times first tokens, checks EOS / stop ids / max_tokens and frees the
blocks of whatever finished. Detokenization and stop strings are the output processor's.

This module queues requests and makes each step's decisions (schedule()); the rest of the Scheduler is
functions taking it, one job per module: preemption.py (victims; swap or recompute), cut_in.py, output_builder.py
(the SchedulerOutput the runner gets) and step_update.py (update_from_output() and the end of a request).
The Scheduler's methods are the API everyone calls.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable

from tacit.config import SchedulerConfig
from tacit.memory.block_hash import extend_block_hashes
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.memory.kv_offload import KVOffloadIndex
from tacit.memory.swap import SwapSpace
from tacit.outputs import ModelRunnerOutput
from tacit.scheduling import cut_in, output_builder, preemption, step_update
from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.length_predictor import OutputLengthPredictor
from tacit.scheduling.policy import FCFSPolicy, SchedulerView, SchedulingPolicy
from tacit.scheduling.prefix_order import PrefixOrder
from tacit.scheduling.request import Request, RequestStatus
from tacit.scheduling.scheduler_output import EngineCoreOutput, SchedulerOutput, SchedulerStats
from tacit.scheduling.spec_controller import DraftLengthController
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
        offload: KVOffloadIndex | None = None,
        eos_token_ids: Iterable[int] = (),
        structured_output: StructuredOutputManager | None = None,
        min_speculative_tokens: int = 0,
        num_speculative_tokens: int = 0,
        num_lookahead_tokens: int = 0,
    ) -> None:
        """num_lookahead_tokens (vLLM's name): KV slots held past each step's tokens, for a
        proposer whose layers write the target's pool ahead of them (MTP: its chained drafts).
        Such a proposer's first KV entry of a prefix hit needs the target's hidden state of the
        token before it, so a hit gives back its last block to be recomputed (vLLM's rule for
        EAGLE)."""
        self.config = config
        self.kv = kv
        self.policy = policy or FCFSPolicy()
        self.clock = clock
        self.now = clock()
        self.cost = StepCostModel()  # learns every step's measured time (update_from_output)
        self.predictor = OutputLengthPredictor()  # learns every finished request's length
        self.swapper = swapper  # None: preemption always recomputes
        self.offload = offload  # the prefix cache's second tier (None: blocks evicted are gone)
        self.eos_token_ids = frozenset(eos_token_ids)
        # Matchers of the requests with a grammar (None: this scheduler refuses them).
        self.structured_output = structured_output
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = self.num_cut_ins = 0
        self.last_step_shape = (0, 0, 0)  # the last step's (prompt tokens, decodes, drafts): step_update
        # Speculative decoding since start (verifies, drafts verified, accepted); spec decides draft lengths.
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        # num_speculative_tokens 0: no speculative config, so no step prices drafts (a proposer a
        # test attaches by hand still has every draft it offers verified).
        self.speculative = num_speculative_tokens > 0
        self.spec = DraftLengthController(self.cost, min_speculative_tokens, num_speculative_tokens or 8)
        self.num_lookahead_tokens = num_lookahead_tokens
        self._finished_req_ids: list[str] = []  # for the runner, with the next SchedulerOutput
        self.view = SchedulerView(self)
        self.prefix_order = PrefixOrder(self)  # the waiting queue's cache-aware order

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

    def replace_config(self, **changes: int) -> None:
        """Frozen SchedulerConfig, so a checked copy; every reader takes self.config afresh each schedule()."""
        self.config = dataclasses.replace(self.config, **changes)

    def _preempt(self, request: Request, preempted: list[Request]) -> None:
        """Send a running request back to waiting with its blocks freed, its KV swapped out
        first if preemption.should_swap says so (else recomputed when it resumes)."""
        self.running.remove(request)
        self.policy.on_stop(request)
        num_blocks = self.kv.blocks_needed(request.num_computed_tokens)
        if preemption.should_swap(self, request, num_blocks):
            # Before the blocks are freed: this same schedule() may hand them to someone else.
            self.swapper.swap_out(request.request_id, self.kv.get_block_ids(request.request_id)[0][:num_blocks])
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
        # Aged requests first (FCFS among them), then the policy's order (cache-aware: prefix_order.py).
        aging = self.config.aging_s
        if not req.aged and aging is not None and self.now - req.arrival_time >= aging:
            req.aged = True
        if req.aged:
            return (0, req.arrival_time, req.arrival_seq)
        return (1, *self.prefix_order.waiting_key(req))

    def _next_waiting(self, short_only: bool = False) -> Request | None:
        pool = [r for r in self.waiting if not self.is_long(r)] if short_only else self.waiting
        return min(pool, key=self._waiting_key) if pool else None

    def is_long(self, req: Request) -> bool:
        cap = self.config.long_prefill_token_threshold
        return bool(cap) and req.num_tokens - req.num_computed_tokens > cap

    def uncached_tokens(self, req: Request) -> int:
        """Tokens req has left to compute, less (not started yet) the prefix cache's blocks: what policies price."""
        left = req.num_tokens - req.num_computed_tokens
        hashes = self._lookup_hashes(req)
        if hashes is None:
            return left
        kv = self.kv
        pooled = kv.cached_prefix_blocks(hashes, req.num_tokens, kv.pool_of(req.request_id))
        tiered = self.offload.peek(kv.usable_prefix(hashes, req.num_tokens)[pooled:]) if self.offload else 0
        return left - (pooled + tiered) * kv.block_size

    def _lookup_hashes(self, req: Request) -> list[bytes] | None:
        """The block hashes of a request that may read the prefix cache, brought up to date; None
        for one that may not: it has started (computed tokens or blocks), the cache is off, or it
        wants prompt_logprobs or a MEAN / CLS embedding (the positions need their hidden states,
        which a hit would skip; like vLLM v1, it still offers its own blocks to later requests)."""
        kv = self.kv
        if (
            not kv.enable_caching
            or req.num_computed_tokens
            or kv.num_blocks_of(req.request_id)
            or req.params.computes_every_prompt_token
        ):
            return None
        extend_block_hashes(req.block_hashes, req.all_token_ids, kv.block_size, req.cache_salt)
        return req.block_hashes

    def _outranks(self, waiting: Request, running: Request) -> bool:
        if running.aged:
            return False  # the aging bound: once it has aged and got in, nothing pushes it out
        return self.policy.outranks(waiting, running)

    def _chunk(self, req: Request, budget: int) -> int:
        """Tokens req may compute this step: all it has left, within the budget and the long-prefill cap (0: none)."""
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        cap = self.config.long_prefill_token_threshold
        return min(n, cap) if cap and self.config.enable_chunked_prefill else n

    def _place(self, req: Request, budget: StepBudget, long: bool) -> int:
        """The pool (data-parallel attention's rank) of a request about to be scheduled: one not
        yet holding blocks goes to the pool caching most of its prefix, then to one with a
        long-prefill slot left if it is long, then the most of this step's budget left, then the
        most free blocks."""
        kv, rid = self.kv, req.request_id
        if kv.num_pools > 1 and not kv.num_blocks_of(rid):
            hashes = self._lookup_hashes(req)
            kv.place(
                rid,
                max(
                    range(kv.num_pools),
                    key=lambda p: (
                        kv.cached_prefix_blocks(hashes, req.num_tokens, p) if hashes else 0,  # where it is cached
                        long and budget.long_left[p] > 0,
                        budget.of(p),
                        kv.num_free_blocks_in(p),
                        -p,
                    ),
                ),
            )
        return kv.pool_of(rid)

    def _prefix_hit(self, req: Request) -> tuple[list[int], list[bytes]]:
        """The prefix cache's blocks for a request starting from nothing (fresh, or preempted to
        be recomputed), and the hashes of the blocks the second tier holds right after them, its
        num_computed_tokens moved past both ([], [] if it may not read the cache)."""
        hashes = self._lookup_hashes(req)
        if hashes is None:
            return [], []
        kv = self.kv
        blocks, req.num_computed_tokens = kv.get_computed_blocks(req.request_id, hashes, req.num_tokens)
        tiered = []
        if self.offload is not None:
            rest = kv.usable_prefix(hashes, req.num_tokens)[len(blocks) :]
            tiered = rest[: self.offload.lookup(rest, req.num_tokens - req.num_computed_tokens, kv.block_size)]
            req.num_computed_tokens += len(tiered) * kv.block_size
        if self.num_lookahead_tokens and (blocks or tiered):  # the hit's last block is recomputed
            tiered, blocks = (tiered[:-1], blocks) if tiered else ([], blocks[:-1])
            req.num_computed_tokens -= kv.block_size
        return blocks, tiered

    def _slots(self, req: Request, n: int) -> int:
        """KV slots a step of n tokens holds past req's computed ones: n, plus lookahead up to req's last position."""
        if not self.num_lookahead_tokens:
            return n
        end = req.num_prompt_tokens + req.max_tokens
        return n + max(0, min(self.num_lookahead_tokens, end - req.num_computed_tokens - n))

    def _start(self, req: Request) -> None:
        self.waiting.remove(req)
        req.status = RequestStatus.RUNNING
        req.first_scheduled_time = self.now if req.first_scheduled_time is None else req.first_scheduled_time
        self.running.append(req)
        self.policy.on_start(req)

    def _drafts_to_verify(self, req: Request, budget: int) -> list[int]:
        """The draft tokens req's step verifies: only while it decodes (one token left to
        compute), as many as the step's budget has room for past that token, and no more than
        could be kept before max_tokens (which also keeps every position within max_model_len).
        Under a grammar, none past the first it refuses (the mask would refuse it; each verify
        row gets the mask of its position: StructuredOutputManager.grammar_bitmask)."""
        drafts = req.spec_token_ids
        if not drafts or req.num_tokens - req.num_computed_tokens != 1:
            return []
        if self.structured_output is not None and req.request_id in self.structured_output:
            drafts = drafts[: self.structured_output.valid_draft_prefix(req.request_id, drafts)]
        room = min(budget - 1, req.max_tokens - len(req.output_token_ids) - 1)
        return drafts[: self.spec.draft_length(req, max(min(room, len(drafts)), 0))]

    def schedule(self) -> SchedulerOutput:
        self.now = self.clock()
        self.prefix_order.begin_step()
        scheduled: list[tuple[Request, int, tuple[list[int], ...] | None]] = []
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
        if self.speculative:  # the cost model's fit, once a step, only where drafts are priced
            self.spec.begin_step(len(self.running))
        cut_in.trim_running(self, preempted)
        preemption.make_room_for_urgent(self, preempted)
        urgent_preemption = bool(preempted)

        i = 0
        while i < len(self.running) and budget.total > 0:
            req = self.running[i]
            pool = self.kv.pool_of(req.request_id)
            n = self._chunk(req, budget.of(pool))
            verify = self._drafts_to_verify(req, budget.of(pool))
            n += len(verify)  # draft tokens are computed (their KV written) like any scheduled token
            long = self.is_long(req)
            if (
                not n
                or (not chunked and n < req.num_tokens - req.num_computed_tokens)
                or (long and not budget.take_long_slot(pool))
            ):
                i += 1
                continue
            new_blocks = self.kv.allocate_slots(req.request_id, req.num_computed_tokens, self._slots(req, n))
            while new_blocks is None:
                # Only requests not yet given slots this step are candidates (they sit at i and
                # after), and only those whose blocks share req's pool (data-parallel attention).
                victim = preemption.pick_victim_for_blocks(
                    self, [r for r in self.running[i:] if self.kv.same_pool(r.request_id, req.request_id)], req
                )
                self._preempt(victim, preempted)
                if victim is req:
                    break
                new_blocks = self.kv.allocate_slots(req.request_id, req.num_computed_tokens, self._slots(req, n))
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
            pool = self._place(req, budget, self.is_long(req))
            # Its computed tokens now start past the cached blocks (the pool's, then the tier's).
            hit, tiered = self._prefix_hit(req)
            long = self.is_long(req)
            n = self._chunk(req, budget.of(pool))
            new_blocks = None
            if (
                not n
                or (n < req.num_tokens - req.num_computed_tokens and not chunked)
                or (long and not budget.take_long_slot(pool))
                or (
                    new_blocks := self.kv.allocate_slots(
                        req.request_id, req.num_computed_tokens, self._slots(req, n), hit
                    )
                )
                is None
            ):
                if hit or tiered:
                    req.num_computed_tokens = 0  # nothing was taken: it looks the prefix up again
                break
            if tiered:  # its first new blocks are filled from the tier before the step runs
                self.offload.load(tiered, new_blocks[0][: len(tiered)])
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = req.num_computed_tokens  # the hit's and the tier's blocks
            if self.swapper is not None and self.swapper.holds(req.request_id):
                self.swapper.swap_in(req.request_id, self.kv.get_block_ids(req.request_id)[0])
            self._start(req)
            scheduled.append((req, n, None))
            budget.spend(pool, n)
        return output_builder.build_scheduler_output(self, scheduled, preempted, drafts)

    def save_prefix_cache(self) -> SchedulerOutput:
        """A step that only stores the pool's cached blocks in the second tier (at shutdown)."""
        self.offload.save_all(self.kv.cached_blocks())
        return output_builder.build_scheduler_output(self, [], [])

    def may_cut_in(self, req: Request) -> bool:
        """Would req be prefilled inside the step in flight if it arrived now (blocks allowing)?"""
        return cut_in.may_cut_in(self, req)

    def schedule_cut_in(self) -> SchedulerOutput:
        """Requests to prefill now, between two layers of the step in flight (cut_in.py)."""
        return cut_in.schedule_cut_in(self)

    # ---- after the step ---------------------------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Advance, append, finish: the one update after each step (step_update.py)."""
        return step_update.update_from_output(self, scheduler_output, runner_output)

    def finish_request(self, request_id: str, reason: str, stop_reason: int | str | None = None) -> None:
        """End a request (finished, stopped by a stop string, or aborted) and give its blocks
        back at once; the runner drops its state with the next SchedulerOutput."""
        step_update.finish_request(self, request_id, reason, stop_reason)

    def make_stats(self) -> SchedulerStats:
        return step_update.make_stats(self)
