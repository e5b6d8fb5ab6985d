"""Prompt logprobs: score a prefill chunk's prompt tokens from the hidden states the forward
already computed, for the requests that asked (SamplingParams.prompt_logprobs).

The hidden state at prompt position p predicts prompt token p + 1, so a chunk covering
positions [c, c + n) scores tokens c + 1 .. c + n: its last position scores the first token of
the next chunk, which the runner already holds. Chunked and unchunked prefill therefore score
every token from the same position and agree exactly. The lm_head over every prompt row is
the cost, so only these requests pay it, in slices that bound the float32 logits' memory.
"""

from __future__ import annotations

from typing import Callable

import torch

from tacit.layers.sampler import gather_logprobs
from tacit.outputs import RawLogprobs, RawPromptLogprobs

# float32 logits of one slice at most this big: 64 MiB is 341 rows of a 49,152-token vocabulary
# (SmolLM2), 110 of 151,936 (Qwen2); log_softmax doubles it for a moment.
_SLICE_BYTES = 64 << 20


def prompt_tokens_to_score(num_computed: int, num_new: int, num_prompt_tokens: int, next_token: int) -> tuple[int, int]:
    """[first, end) of the prompt tokens a chunk of positions [num_computed, num_computed +
    num_new) scores, starting no earlier than next_token (those before were scored already, by
    an earlier chunk or before a preemption threw the KV away)."""
    first = max(num_computed + 1, next_token)
    end = min(num_computed + num_new + 1, num_prompt_tokens)
    return first, max(first, end)


def score_prompt_tokens(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    token_ids: list[int],
    start: int,
    num_top: int,
    vocab_size: int,
    full: Callable[[int, torch.Tensor], None] | None = None,
) -> RawPromptLogprobs:
    """hidden[i] is the final hidden state of the position before prompt token start + i, and
    token_ids[i] that token. full, if given, also receives each slice's whole float32 log-softmax
    (first prompt token it scores, [rows, vocab] on the CPU): what `tacit eval kld` compares."""
    rows = max(1, _SLICE_BYTES // (4 * vocab_size))
    entries: list[RawLogprobs] = []
    targets = torch.tensor(token_ids, dtype=torch.long, device=hidden.device)
    for i in range(0, len(token_ids), rows):
        logprobs = compute_logits(hidden[i : i + rows]).float().log_softmax(dim=-1)
        if full is not None:
            full(start + i, logprobs.cpu())
        entries += gather_logprobs(logprobs, targets[i : i + rows], num_top)
    return RawPromptLogprobs(start, list(token_ids), entries)
