"""SchedulerOutput: what one step runs, handed from the scheduler to the model runner as plain data.

vLLM v1's shape (core/sched/output.py): a request the runner has not seen, or one resumed after
a preemption, comes whole (NewRequestData: its tokens, sampling parameters and every block);
a request already running comes as a delta (CachedRequestData: the blocks added this step).
The runner keeps its own copy of each request's state from these, so nothing below the
scheduler ever holds a live Request, and with several worker processes this same object is
what each of them receives. update_from_output answers with an EngineCoreOutput per request
with news (a sampled token, scored prompt tokens, or an end), and make_stats with SchedulerStats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tacit.memory.kv_offload import OffloadOp
from tacit.memory.swap import SwapOp
from tacit.outputs import RawLogprobs, RawPromptLogprobs
from tacit.sampling_params import SamplingParams


def samples_this_step(num_computed_tokens: int, num_scheduled: int, num_tokens: int, params: SamplingParams) -> bool:
    """Whether a request samples a token in a step: the step brings it level with all its tokens
    (not mid-prefill) and it generates at all (max_tokens=0 only scores its prompt). The
    scheduler masks exactly these rows' grammars and the runner samples exactly these rows."""
    return num_computed_tokens + num_scheduled == num_tokens and params.max_tokens != 0


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner must (re)build its state for: first scheduled, or resumed."""

    req_id: str
    prompt_token_ids: list[int]
    # Tokens already generated (non-empty only for a request resumed after a preemption that the
    # runner dropped, so its next position and penalties see them).
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]  # one table per KV cache group
    num_computed_tokens: int
    # Data-parallel attention: the rank that attends over it, in whose KV pool block_ids lie
    # (always 0 otherwise). A request resumed after a preemption may come back on another.
    dp_rank: int = 0


@dataclass(frozen=True)
class CachedRequestData:
    """A request the runner already holds: where it stands now and the blocks it gained."""

    req_id: str
    new_block_ids: tuple[list[int], ...]  # appended to each KV cache group's table
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    # req_id -> tokens it computes this step, in row order (the runner's batch follows it).
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # Preempted this step: the runner keeps their state (the scheduler resends them whole on
    # resume) but they are not in this step's batch.
    preempted_req_ids: list[str] = field(default_factory=list)
    # Finished or aborted since the previous output: the runner drops their state.
    finished_req_ids: list[str] = field(default_factory=list)
    # Constrained decoding (vLLM's names): the rows that sample this step under a grammar, and
    # their allowed tokens, packed (int32 [len(ids), ceil(vocab / 32)], row i for ids[i]; bit j
    # of word w allows token 32 * w + j). None when no row this step is constrained.
    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: np.ndarray | None = None
    # KV copies to or from host memory that every rank's runner makes before the forward, in
    # order (preemption by swap; tacit/memory/swap.py).
    swap_ops: list[SwapOp] = field(default_factory=list)
    # Copies between the pool and the prefix cache's second tier that every rank's runner makes
    # before the forward: stores and discards first, then the swap ops, then loads
    # (tacit/memory/kv_offload.py).
    kv_offload_ops: list[OffloadOp] = field(default_factory=list)
    # Speculative decoding (vLLM's name): req_id -> the draft tokens this step verifies. They
    # are scheduled tokens: such a request's num_scheduled_tokens is 1 + len(drafts), its last
    # token and then the drafts, each computed (its KV written) as if accepted.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Whether the runner's proposer should draft after this step: False when no draft could be
    # worth verifying at the step's cost (scheduling/spec_controller.py), so it spends nothing.
    propose_drafts: bool = True

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def req_ids(self) -> list[str]:
        return list(self.num_scheduled_tokens)

    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens

    def step_shape(self) -> tuple[int, int, int]:
        """(prompt tokens, decodes, draft tokens) this step computes: what its time is fitted on
        (StepCostModel). A decode computes one token beside its drafts; anything else prefills."""
        prefill = decodes = drafts = 0
        for req_id, n in self.num_scheduled_tokens.items():
            num_drafts = len(self.scheduled_spec_decode_tokens.get(req_id, ()))
            if n - num_drafts == 1:
                decodes += 1
            else:
                prefill += n
            drafts += num_drafts
        return prefill, decodes, drafts


@dataclass(frozen=True)
class EngineCoreOutput:
    """One request's news from one step (vLLM v1's name): the tokens it gained (one, or several
    when a verify step accepted draft tokens; none for a chunk mid-prefill that scored prompt
    tokens, or a prompt only scored, max_tokens=0, finishing its prefill), whether that ended
    it (the tokens stop at the one that did), and the prompt tokens its prefill chunk scored.
    The output processor turns these into text and RequestOutputs."""

    req_id: str
    new_token_ids: list[int]
    logprobs: list[RawLogprobs] | None  # one per new token, when the request asked for them
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: RawPromptLogprobs | None = None
    # Prompt tokens its first schedule found in the prefix cache (0 before it was scheduled).
    num_cached_tokens: int = 0
    # An embedding request whose prompt ended: its pooled vector.
    pooled: list[float] | None = None


@dataclass(frozen=True)
class SchedulerStats:
    """Counters for /metrics and benchmarks, read in one call (nothing reaches into the parts)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    num_preemptions: int
    num_swapped_out: int
    num_swapped_in: int
    swap_blocks_used: int
    num_cut_ins: int
    length_predictor_mae: float
    length_predictor_scored: int
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of them, found
    kv_blocks_cached: int = 0
    # The second tier (memory/kv_offload.py): prompt tokens looked up there past the pool's hit,
    # and found (vLLM's external_prefix_cache_*); the blocks it holds, stored and loaded.
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    kv_offload_blocks: int = 0
    kv_offload_stored: int = 0
    kv_offload_loaded: int = 0
    spec_decode_num_drafts: int = 0  # verifies: steps of a request that verified drafts
    spec_decode_num_draft_tokens: int = 0  # draft tokens verified
    spec_decode_num_accepted_tokens: int = 0  # of them, accepted
