"""From a step's logits to each sampling request's new tokens, verifying draft tokens on the way.

A request verifying k draft tokens has k + 1 logits rows: row j holds the distribution after
its token and drafts 1..j. Every row is sampled as if it stood alone (its own penalties, its own
noise), and the drafts are accepted while each equals the token sampled at the position before
it; the token sampled after the last accepted draft ends the list. Each kept token is thus drawn
from the model's distribution given the tokens actually kept before it, so with or without
drafts greedy output is the same and sampled output has the same distribution (an exact-match
verifier: rejection sampling accepts more drafts of a random request, and is the speculative
decoding issue's to add). A seeded request draws its noise from its own generator once per
row sampled, so its draw depends on how many drafts it was given, though never on its batch.
"""

from __future__ import annotations

import torch

from tacit.layers.sampler import Sampler, SamplingMetadata
from tacit.outputs import RawLogprobs
from tacit.scheduling.scheduler_output import SchedulerOutput
from tacit.worker.request_state import CachedRequestState


def sampling_metadata(states: list[CachedRequestState], scheduler_output: SchedulerOutput) -> SamplingMetadata:
    """One metadata entry per logits row: a request's drafts each add a row whose penalties see
    the drafts before it as generated."""
    params, output_ids, generators, prompt_ids = [], [], [], []
    for r in states:
        p = r.sampling_params
        # Only penalties read the generated ids; slicing them out of every row's token list
        # each step would copy the whole context of every sampling row for nothing.
        out = r.token_ids[r.num_prompt_tokens : len(r.token_ids) - r.num_draft_tokens] if p.needs_penalties else []
        # The repetition penalty also counts the prompt (one slice shared by the request's rows).
        prompt = r.token_ids[: r.num_prompt_tokens] if p.repetition_penalty != 1.0 else []
        drafts = r.draft_token_ids
        for j in range(1 + len(drafts)):
            params.append(p)
            output_ids.append(out + drafts[:j] if p.needs_penalties else [])
            generators.append(r.generator)
            prompt_ids.append(prompt)
    metadata = SamplingMetadata(params, output_ids, generators)
    if any(prompt_ids):
        metadata.prompt_token_ids = prompt_ids
    if scheduler_output.grammar_bitmask is not None:
        add_grammar_bitmask(metadata, states, scheduler_output)
    return metadata


def add_grammar_bitmask(
    metadata: SamplingMetadata, states: list[CachedRequestState], scheduler_output: SchedulerOutput
) -> None:
    """Point the scheduler's bitmask rows at the logits rows they constrain: a request's rows in
    order, its last token's and then one per draft it verifies (the scheduler masks each
    position as if the drafts before it had been sampled)."""
    row_of, width, row = {}, {}, 0
    for r in states:
        row_of[r.req_id], width[r.req_id] = row, 1 + r.num_draft_tokens
        row += 1 + r.num_draft_tokens
    ids = scheduler_output.structured_output_request_ids
    missing = [rid for rid in ids if rid not in row_of]
    if missing:  # the scheduler masks only rows that sample: anything else is a bookkeeping bug
        raise RuntimeError(f"grammar bitmask for requests that do not sample this step: {missing}")
    metadata.grammar_rows = [row_of[rid] + j for rid in ids for j in range(width[rid])]
    metadata.grammar_bitmask = torch.from_numpy(scheduler_output.grammar_bitmask)


def sample_and_verify(
    sampler: Sampler, logits: torch.Tensor, states: list[CachedRequestState], scheduler_output: SchedulerOutput
) -> tuple[list[list[int]], list[list[RawLogprobs] | None]]:
    """Per sampling request: its new tokens (accepted drafts, then one sampled token) and their
    logprobs (None unless it asked for them)."""
    sampled = sampler(logits, sampling_metadata(states, scheduler_output))
    tokens, logprobs, row = [], [], 0
    for r in states:
        drafts = r.draft_token_ids
        rows = sampled.token_ids[row : row + 1 + len(drafts)]
        accepted = 0
        while accepted < len(drafts) and rows[accepted] == drafts[accepted]:
            accepted += 1
        tokens.append(rows[: accepted + 1])
        wanted = r.sampling_params.logprobs is not None
        logprobs.append(sampled.logprobs[row : row + accepted + 1] if wanted else None)
        row += 1 + len(drafts)
    return tokens, logprobs
