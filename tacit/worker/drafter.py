"""The draft-proposer seam of speculative decoding: after each step the runner asks its proposer
for the next draft tokens of every request that sampled, and hands them to the scheduler in
ModelRunnerOutput.draft_token_ids (vLLM v1's spec_token_ids); the scheduler's next step
verifies as many as its budget and the request's max_tokens leave room for.

A proposer sees the runner's own request states after the step settled: every kept token in
token_ids, the sampling parameters. Proposers (n-gram, suffix, draft model, MTP) implement
propose(); verification is tacit/worker/sample_step.py's, the step contract the scheduler's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from tacit.worker.request_state import CachedRequestState


class DraftProposer(ABC):
    @abstractmethod
    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        """{req_id: draft tokens to follow its last token}; a request left out (or given an
        empty list) decodes one token in its next step."""
