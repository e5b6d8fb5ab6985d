"""A draft proposer for tests: it proposes what a reference run generated, wrong where told."""

from __future__ import annotations

from tacit.worker.drafter import DraftProposer
from tacit.worker.request_state import CachedRequestState


class ScriptedProposer(DraftProposer):
    """For each request, the next k tokens of a known continuation of its prompt, with the
    drafts at the positions `wrong` names replaced by a token the continuation does not have
    there (so the verifier must reject from that draft on)."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], k: int, wrong=lambda done, j: False):
        self.continuations, self.k, self.wrong = continuations, k, wrong
        self.proposed = 0

    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        out = {}
        for r in requests:
            ref = self.continuations[tuple(r.token_ids[: r.num_prompt_tokens])]
            done = r.num_tokens - r.num_prompt_tokens
            drafts = ref[done : done + self.k]
            out[r.req_id] = [(t + 1) % 50 if self.wrong(done, j) else t for j, t in enumerate(drafts)]
            self.proposed += len(out[r.req_id])
        return out
