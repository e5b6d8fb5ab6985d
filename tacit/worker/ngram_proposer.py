"""Prompt-lookup (n-gram) drafts, vLLM's "ngram" method: the request's last n tokens (n from
prompt_lookup_max down to prompt_lookup_min) are looked for earlier in its own tokens, and the
tokens that followed the latest match are proposed. It costs no model: it pays where output
repeats its context (code edits, summaries quoting the input, structured lists) and proposes
nothing where it does not. Verification keeps only what the model itself would have produced.
"""

from __future__ import annotations

import numpy as np

from tacit.config.speculative import SpeculativeConfig
from tacit.worker.drafter import DraftProposer, register_draft_proposer
from tacit.worker.request_state import CachedRequestState


def ngram_drafts(tokens: np.ndarray, k: int, n_max: int, n_min: int) -> list[int]:
    """The k tokens after the latest earlier occurrence of the longest suffix of `tokens` (of
    n_max down to n_min tokens) that occurs earlier; [] if none does."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n :]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if len(starts):
            start = int(starts[-1]) + n  # the latest match; what followed it
            return tokens[start : start + k].tolist()
    return []


@register_draft_proposer("ngram")
class NgramProposer(DraftProposer):
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.n_max, self.n_min = config.prompt_lookup_max, config.prompt_lookup_min

    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        out = {}
        for r in requests:
            drafts = ngram_drafts(np.asarray(r.token_ids, dtype=np.int64), self.k, self.n_max, self.n_min)
            if drafts:
                out[r.req_id] = drafts
        return out
