"""After the step: update_from_output(), the one place that advances num_computed_tokens,
appends sampled tokens, times first tokens and checks EOS / stop ids / max_tokens; the end of a
request (finish_request: its blocks freed, its length taught to the predictor); and the
scheduler's stats.

Each function takes the Scheduler as `s`, untyped: importing Scheduler here would close an
import cycle (scheduler.py imports this module).
"""

from __future__ import annotations

from tacit.memory.block_hash import extend_block_hashes
from tacit.outputs import ModelRunnerOutput
from tacit.scheduling.request import Request, RequestStatus
from tacit.scheduling.scheduler_output import EngineCoreOutput, SchedulerOutput, SchedulerStats


def update_from_output(
    s, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
) -> list[EngineCoreOutput]:
    """Advance every scheduled request by the tokens it computed (less the draft tokens its
    verify step rejected), append what was sampled, finish (and free) requests that hit
    EOS, a stop token id or max_tokens (0: at the end of the prefill), pass on the prompt
    logprobs the runner scored and keep the proposer's drafts for the next step."""
    if s.swapper is not None:
        s.swapper.observe(runner_output.swap_blocks, runner_output.swap_s)
    verified = scheduler_output.scheduled_spec_decode_tokens
    for req_id, n in scheduler_output.num_scheduled_tokens.items():
        req = s.requests.get(req_id)
        if req is not None:
            req.num_computed_tokens += n
            req.spec_token_ids = []
    prefill_tokens, decodes, draft_tokens = s.last_step_shape = scheduler_output.step_shape()
    s.cost.observe(prefill_tokens, decodes, runner_output.execute_s - runner_output.propose_s, draft_tokens)
    if runner_output.draft_token_ids:
        proposed = sum(len(d) for d in runner_output.draft_token_ids.values())
        s.spec.observe_proposer(runner_output.propose_s - runner_output.propose_catch_up_s, proposed)
    now = s.clock()
    outputs = []
    scored = runner_output.prompt_logprobs
    sampled = set(runner_output.req_ids)
    for req_id, tokens, logprobs in zip(runner_output.req_ids, runner_output.sampled_token_ids, runner_output.logprobs):
        req = s.requests.get(req_id)
        if req is None or req.is_finished:
            continue  # aborted while its step ran
        # Rejected drafts: their KV slots lie past every kept token and are written over by
        # the tokens that take their positions; the blocks stay the request's.
        num_drafts = len(verified.get(req_id, ()))
        req.num_computed_tokens -= num_drafts + 1 - len(tokens)
        if num_drafts:  # vLLM's spec-decode counters: verifies, drafts verified, and of them accepted
            s.num_drafts += 1
            s.num_draft_tokens += num_drafts
            s.num_accepted_tokens += len(tokens) - 1
            s.spec.observe(req, num_drafts, len(tokens) - 1)
        if req.first_token_time is None:
            req.first_token_time = now
        req.last_token_time = now
        new, reason, stop_reason = append_tokens(s, req, tokens)
        cache_verified_blocks(s, req)  # before a finish frees them: a later turn may hit them
        if reason is not None:
            finish_request(s, req_id, reason, stop_reason)
        kept = None if logprobs is None else logprobs[: len(new)]
        cached = max(req.num_cached_tokens, 0)
        outputs.append(EngineCoreOutput(req_id, new, kept, reason, stop_reason, scored.get(req_id), cached))
    for req_id, drafts in runner_output.draft_token_ids.items():
        req = s.requests.get(req_id)
        if req is not None and req.status == RequestStatus.RUNNING:
            req.spec_token_ids = list(drafts)
    # News without a token: prompt tokens a chunk scored mid-prefill, and a prompt that was
    # only to be scored (max_tokens=0) ending with its prefill.
    for req_id in scheduler_output.num_scheduled_tokens:
        req = s.requests.get(req_id)
        if req_id in sampled or req is None or req.is_finished:
            continue
        cache_verified_blocks(s, req)
        reason = None
        if req.max_tokens == 0 and req.num_computed_tokens >= req.num_tokens:
            reason = "length"
            finish_request(s, req_id, reason)
        if reason is not None or req_id in scored:
            pooled = runner_output.pooler_output.get(req_id)
            cached = max(req.num_cached_tokens, 0)
            outputs.append(EngineCoreOutput(req_id, [], None, reason, None, scored.get(req_id), cached, pooled))
    return outputs


def append_tokens(s, req: Request, tokens: list[int]) -> tuple[list[int], str | None, int | str | None]:
    """Append a step's tokens one at a time, each checked as if it came alone: the tokens
    kept (up to the one that ended the request), the finish reason and the stop reason."""
    so = s.structured_output
    for k, token in enumerate(tokens):
        req.append_output_token(token)
        grammar_ended = bool(so) and so.accept_token(req.request_id, token)
        reason, stop_reason = check_stop(s, req, token)
        if reason is None and grammar_ended:
            reason = "stop"  # the grammar is complete (or refused the token): nothing valid can follow
        if reason is not None:
            return tokens[: k + 1], reason, stop_reason
    return tokens, None, None


def check_stop(s, req: Request, token: int) -> tuple[str | None, int | None]:
    p = req.params
    n_out = len(req.output_token_ids)
    if n_out >= p.min_tokens and ((not p.ignore_eos and token in s.eos_token_ids) or token in p.stop_token_ids):
        return "stop", token
    if n_out >= req.max_tokens:
        return "length", None
    return None, None


def cache_verified_blocks(s, req: Request) -> None:
    """Offer the prefix cache the request's blocks now full of verified tokens (computed, kept,
    and part of its token list: a token sampled this step is neither)."""
    if not s.kv.enable_caching:
        return
    extend_block_hashes(req.block_hashes, req.all_token_ids, s.kv.block_size, req.cache_salt)
    s.kv.cache_blocks(req.request_id, req.block_hashes, min(req.num_computed_tokens, req.num_tokens))


def finish_request(s, request_id: str, reason: str, stop_reason: int | str | None = None) -> None:
    """End a request (finished, stopped by a stop string, or aborted) and give its blocks
    back at once; the runner drops its state with the next SchedulerOutput."""
    req = s.requests.pop(request_id, None)
    if req is None:
        return
    if not req.is_finished:
        req.finish(reason, stop_reason)
    if req in s.running:
        s.running.remove(req)
        s.policy.on_stop(req)
    elif req in s.waiting:
        s.waiting.remove(req)
    s.kv.free(request_id)
    if s.swapper is not None:
        s.swapper.drop(request_id)
    if s.structured_output is not None:
        s.structured_output.remove_request(request_id)
    s._finished_req_ids.append(request_id)
    # An abort says nothing about how long it would have run, nor a prompt only scored.
    if reason in ("stop", "length") and req.max_tokens > 0:
        p = req.params
        s.predictor.observe(
            req.num_prompt_tokens,
            req.max_tokens,
            p.temperature,
            p.expected_output_tokens,
            req.predicted_output_tokens,
            len(req.output_token_ids),
        )


def make_stats(s) -> SchedulerStats:
    swap, tier = s.swapper, s.offload
    return SchedulerStats(
        num_running=len(s.running),
        num_waiting=len(s.waiting),
        kv_blocks_used=s.kv.num_used_blocks,
        kv_blocks_free=s.kv.num_free_blocks,
        num_preemptions=s.num_preemptions,
        num_swapped_out=swap.num_swapped_out if swap else 0,
        num_swapped_in=swap.num_swapped_in if swap else 0,
        swap_blocks_used=swap.used_blocks if swap else 0,
        num_cut_ins=s.num_cut_ins,
        length_predictor_mae=s.predictor.mean_abs_error or 0.0,
        length_predictor_scored=s.predictor.num_scored,
        prefix_cache_queries=s.kv.prefix_cache_queries,
        prefix_cache_hits=s.kv.prefix_cache_hits,
        kv_blocks_cached=s.kv.num_cached_blocks,
        external_prefix_cache_queries=tier.queries if tier else 0,
        external_prefix_cache_hits=tier.hits if tier else 0,
        kv_offload_blocks=tier.num_blocks if tier else 0,
        kv_offload_stored=tier.num_stored if tier else 0,
        kv_offload_loaded=tier.num_loaded if tier else 0,
        spec_decode_num_drafts=s.num_drafts,
        spec_decode_num_draft_tokens=s.num_draft_tokens,
        spec_decode_num_accepted_tokens=s.num_accepted_tokens,
    )
