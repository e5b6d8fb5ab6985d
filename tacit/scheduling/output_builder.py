"""A step's decisions as the SchedulerOutput the model runner gets: new requests whole,
running ones as their new blocks, the finished and preempted ids, the swap copies to make and
the grammar bitmask of the rows that sample.

Each function takes the Scheduler as `s`, untyped: importing Scheduler here would close an
import cycle (scheduler.py imports this module).
"""

from __future__ import annotations

from tacit.scheduling.request import Request
from tacit.scheduling.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput, samples_this_step


def build_scheduler_output(
    s,
    scheduled: list[tuple[Request, int, list[int] | None]],
    preempted: list[Request],
    drafts: dict[str, list[int]] | None = None,
) -> SchedulerOutput:
    """The step as plain data; new_blocks None marks a request the runner gets whole."""
    out = SchedulerOutput(
        preempted_req_ids=[r.request_id for r in preempted],
        finished_req_ids=s._finished_req_ids,
        scheduled_spec_decode_tokens=drafts or {},
        propose_drafts=s.spec.propose_after_step(),
    )
    s._finished_req_ids = []
    if s.swapper is not None:
        out.swap_ops = s.swapper.take_ops()
    if s.offload is not None:
        # This step's allocations handed these cached blocks out: copy them down before it runs.
        s.offload.store(s.kv.take_evicted())
        out.kv_offload_ops = s.offload.take_ops()
    for req, n, new_blocks in scheduled:
        out.num_scheduled_tokens[req.request_id] = n
        if new_blocks is None:
            out.scheduled_new_reqs.append(
                NewRequestData(
                    req.request_id,
                    list(req.prompt_token_ids),
                    list(req.output_token_ids),
                    req.params,
                    s.kv.get_block_ids(req.request_id),
                    req.num_computed_tokens,
                    s.kv.pool_of(req.request_id),
                )
            )
        else:
            out.scheduled_cached_reqs.append(CachedRequestData(req.request_id, new_blocks, req.num_computed_tokens))
    so = s.structured_output
    if so:  # no constrained request anywhere: no loop, no mask
        # Only rows that sample this step (brought level with all their tokens) need a mask; a
        # constrained request's verify rows get one each (its drafts the grammar accepts).
        verified = out.scheduled_spec_decode_tokens  # a verify row's n counts its drafts too
        ids = [
            r.request_id
            for r, n, _ in scheduled
            if r.request_id in so
            and samples_this_step(
                r.num_computed_tokens, n - len(verified.get(r.request_id, ())), r.num_tokens, r.params
            )
        ]
        if ids:
            out.structured_output_request_ids = ids
            out.grammar_bitmask = so.grammar_bitmask(ids, out.scheduled_spec_decode_tokens)
    return out
