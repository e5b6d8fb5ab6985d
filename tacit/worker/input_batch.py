"""A step's rows as one flat batch: token ids, positions, block tables, slot mapping and the
attention metadata, built once per step in numpy (not per layer or per request in torch), plus
which rows sample and which score prompt tokens."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from tacit.outputs import RawPromptLogprobs
from tacit.scheduling.scheduler_output import samples_this_step
from tacit.worker.prompt_logprobs import prompt_tokens_to_score
from tacit.worker.request_state import CachedRequestState

# A step's rows: each request's state and the tokens it computes this step, in batch order.
Rows = list[tuple[CachedRequestState, int]]
# req_id -> the prompt tokens its chunk scored this step (only requests with prompt_logprobs).
PromptScores = dict[str, RawPromptLogprobs]


def samples(r: CachedRequestState, n: int) -> bool:
    """Whether r samples a token after computing n more tokens this step."""
    return samples_this_step(r.num_computed_tokens, n, r.num_tokens, r.sampling_params)


def has_pooling(rows: Rows) -> bool:
    """Whether any row is an embedding request's (its pool reads every token's hidden states)."""
    return any(r.sampling_params.pooling is not None for r, _ in rows)


def prompt_tokens_scored(r: CachedRequestState, n: int) -> tuple[int, int]:
    """[first, end) of the prompt tokens this step's chunk of r scores; empty unless it asked."""
    if r.sampling_params.prompt_logprobs is None:
        return 0, 0
    return prompt_tokens_to_score(r.num_computed_tokens, n, r.num_prompt_tokens, r.next_prompt_logprob)


def fusable(r: CachedRequestState, n: int) -> bool:
    """Decode rows may run on the fused decoder: one token, or a verify row (its last token and
    the drafts after it, each run as a decode row of its own: the decoder writes every row's KV
    of a layer before any row attends, so draft j sees the drafts before it). A row that scores
    a prompt token needs its own hidden states, from the torch path."""
    first, end = prompt_tokens_scored(r, n)
    return n == 1 + r.num_draft_tokens and first == end


def decode_row_sampled(rows: Rows) -> list[int]:
    """Of the decode rows a fused step runs (each of `rows` as 1 + its drafts rows, in order),
    those whose hidden states the sampler takes: every row of a request that samples (its last
    token's and one per draft: logit_rows' order)."""
    out, start = [], 0
    for r, n in rows:
        if samples(r, n):
            out.extend(range(start, start + n))
        start += n
    return out


class TorchInputs(NamedTuple):
    """A torch-path forward's inputs, built from its rows (build_inputs)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: Any  # the backend's metadata; a tuple of one per KV cache group when there are several
    samples: list[int]  # rows that sample
    sample_rows: torch.Tensor  # their last token's flat batch row
    # (row index, prompt tokens [first, end) it scores, flat batch row of the position before first)
    scored: list[tuple[int, int, int, int]]


def logit_rows(rows: Rows, sampling: list[int], ends: np.ndarray) -> np.ndarray:
    """The flat batch rows the head projects, given each row's end in the batch: a sampling
    row's last token, and before it one per draft token it verifies (draft j is checked
    against the token the position before it predicts), contiguous and in sampling order."""
    last = ends[sampling] - 1
    drafts = [rows[i][0].num_draft_tokens for i in sampling]
    if not any(drafts):
        return last
    return np.concatenate([np.arange(e - k, e + 1) for e, k in zip(last, drafts)]).astype(np.int64)


def block_tables(rows: Rows, seq_lens: np.ndarray, block_size: int, group: int = 0) -> np.ndarray:
    """[rows, blocks the longest needs] of KV cache group `group`'s block ids, zero-padded."""
    max_blocks = -(-int(seq_lens.max()) // block_size)
    tables = np.zeros((len(rows), max_blocks), dtype=np.int64)
    for i, (r, _) in enumerate(rows):
        t = r.block_ids[group]
        tables[i, : len(t)] = t[:max_blocks]
    return tables


def build_inputs(rows: Rows, block_size: int, attn_backend: Any, device: torch.device) -> TorchInputs:
    bs = block_size
    num_new = np.array([n for _, n in rows], dtype=np.int64)
    computed = np.array([r.num_computed_tokens for r, _ in rows], dtype=np.int64)
    num_reqs, total = len(rows), int(num_new.sum())
    starts = np.zeros(num_reqs + 1, dtype=np.int64)
    np.cumsum(num_new, out=starts[1:])
    token_ids = np.fromiter(
        (t for (r, n), c in zip(rows, computed) for t in r.token_ids[c : c + n]), dtype=np.int64, count=total
    )
    req_of_token = np.repeat(np.arange(num_reqs), num_new)
    offset_in_query = np.arange(total) - starts[req_of_token]
    positions = computed[req_of_token] + offset_in_query
    metas = []
    for group in range(len(rows[0][0].block_ids)):  # one table and slot per token in each group
        tables = block_tables(rows, computed + num_new, bs, group)
        slot_mapping = tables[req_of_token, positions // bs] * bs + positions % bs
        metas.append(attn_backend.build_metadata(num_new, computed, tables, slot_mapping, device, bs))
    meta = metas[0] if len(metas) == 1 else tuple(metas)
    sampling = [i for i, (r, n) in enumerate(rows) if samples(r, n)]
    sample_rows = logit_rows(rows, sampling, starts[1:])
    scored = []
    for i, ((r, n), c) in enumerate(zip(rows, computed)):
        first, end = prompt_tokens_scored(r, n)
        if first < end:
            scored.append((i, first, end, int(starts[i] + first - 1 - c)))
    return TorchInputs(
        torch.from_numpy(token_ids).to(device),
        torch.from_numpy(positions).to(device),
        meta,
        sampling,
        torch.from_numpy(sample_rows).to(device),
        scored,
    )
