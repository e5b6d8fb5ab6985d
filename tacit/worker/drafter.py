"""The draft-proposer seam of speculative decoding: after each step the runner asks its proposer
for the next draft tokens of every request that sampled, and hands them to the scheduler in
ModelRunnerOutput.draft_token_ids (vLLM v1's spec_token_ids); the scheduler's next step
verifies as many as its budget and the request's max_tokens leave room for.

A proposer sees the runner's own request states after the step settled: every kept token in
token_ids, the sampling parameters. Proposers (n-gram and suffix here; draft model, MTP to come)
implement propose() and register under the method name --speculative-config gives
(config/speculative.py lists the names); verification is tacit/worker/sample_step.py's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from tacit.registry import Registry
from tacit.worker.request_state import CachedRequestState


class DraftProposer(ABC):
    @abstractmethod
    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        """{req_id: draft tokens to follow its last token}; a request left out (or given an
        empty list) decodes one token in its next step."""

    def request_finished(self, state: CachedRequestState) -> None:
        """The request ended (its state as the runner drops it): a proposer that learns from
        earlier requests' outputs keeps what it needs."""


DRAFT_PROPOSERS = Registry("draft_proposer")
register_draft_proposer = DRAFT_PROPOSERS.register
