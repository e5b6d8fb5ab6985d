"""The model runner's own copy of each request's state, kept from one SchedulerOutput to the next.

The scheduler sends a request whole once (NewRequestData) and then only what changed
(CachedRequestData); the runner appends the tokens it samples itself. Nothing here is shared
with the scheduler's Request, so the runner could live in another process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tacit.sampling_params import SamplingParams
from tacit.scheduling.scheduler_output import SchedulerOutput


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt, then every token sampled so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]  # one table per KV cache group
    num_computed_tokens: int
    # Seeded requests draw their sampling noise from their own generator; it lives as long as the
    # request (across preemptions), so a seeded output never depends on what else was batched.
    generator: torch.Generator | None = field(default=None, repr=False)
    # The first prompt token whose logprob is not yet out (prompt_logprobs; token 0 has none). It
    # too outlives a preemption, so a prompt recomputed from scratch is not scored twice.
    next_prompt_logprob: int = 1
    # Data-parallel attention: the rank whose KV pool holds block_ids and that runs its tokens.
    dp_rank: int = 0
    # Draft tokens at the end of token_ids that this step verifies (0 outside a verify step):
    # they are computed like the tokens before them until settle() keeps what was accepted.
    num_draft_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def draft_token_ids(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_draft_tokens :] if self.num_draft_tokens else []

    def settle(self, tokens: list[int]) -> None:
        """End the step: drop its draft tokens and append what it produced (the accepted drafts
        and the token sampled after them)."""
        if self.num_draft_tokens:
            del self.token_ids[-self.num_draft_tokens :]
            self.num_draft_tokens = 0
        self.token_ids.extend(tokens)


def update_request_states(states: dict[str, CachedRequestState], out: SchedulerOutput) -> None:
    """Apply one SchedulerOutput: drop finished requests, (re)build new and resumed ones, grow
    running ones by their new blocks."""
    for req_id in out.finished_req_ids:
        states.pop(req_id, None)
    for new in out.scheduled_new_reqs:
        old = states.get(new.req_id)  # a request resumed after a preemption keeps its generator
        generator = old.generator if old is not None else None
        next_prompt_logprob = old.next_prompt_logprob if old is not None else 1
        if generator is None and new.sampling_params.seed is not None:
            generator = torch.Generator().manual_seed(new.sampling_params.seed)
        states[new.req_id] = CachedRequestState(
            new.req_id,
            [*new.prompt_token_ids, *new.output_token_ids],
            len(new.prompt_token_ids),
            new.sampling_params,
            tuple(list(t) for t in new.block_ids),
            new.num_computed_tokens,
            generator,
            next_prompt_logprob,
            new.dp_rank,
        )
    drafts = out.scheduled_spec_decode_tokens
    for cached in out.scheduled_cached_reqs:
        state = states[cached.req_id]
        for table, new_blocks in zip(state.block_ids, cached.new_block_ids):
            table.extend(new_blocks)
        state.num_computed_tokens = cached.num_computed_tokens
        verify = drafts.get(cached.req_id)
        if verify:
            state.token_ids.extend(verify)
            state.num_draft_tokens = len(verify)
