"""The draft-proposer seam of speculative decoding: after each step the runner asks its proposer
for the next draft tokens of every request that sampled, and hands them to the scheduler in
ModelRunnerOutput.draft_token_ids (vLLM v1's spec_token_ids); the scheduler's next step
verifies as many as its budget and the request's max_tokens leave room for.

A proposer sees the runner's own request states after the step settled: every kept token in
token_ids, the sampling parameters. Proposers (n-gram, suffix, a draft model) implement
propose() and register under the method name --speculative-config gives (config/speculative.py
lists the names); one that runs a model of its own builds it in create(), from the DraftTarget it
drafts for. Verification is tacit/worker/sample_step.py's: every proposer's drafts are single
tokens (a point mass, not a distribution), which the verifier accepts with the target's
probability of each, so the output keeps the target's distribution whatever proposed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from tacit.config import EngineConfig
from tacit.config.speculative import SpeculativeConfig
from tacit.platforms import Platform
from tacit.registry import Registry
from tacit.tokenizer import Tokenizer
from tacit.worker.request_state import CachedRequestState


@dataclass(frozen=True)
class DraftTarget:
    """What a proposer running a model of its own learns of the target it drafts for."""

    config: EngineConfig  # the target's, resolved (its max_model_len already capped to its pool)
    tokenizer: Tokenizer
    platform: Platform
    num_blocks: int  # the target's KV pool: a draft never holds more tokens than it can


class DraftProposer(ABC):
    @classmethod
    def create(cls, config: SpeculativeConfig, target: DraftTarget | None) -> DraftProposer:
        """The proposer for this config (target None: a proposer that runs no model is built
        without one, as in tests of the proposer alone)."""
        return cls(config)

    @abstractmethod
    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        """{req_id: draft tokens to follow its last token}; a request left out (or given an
        empty list) decodes one token in its next step."""

    def request_finished(self, state: CachedRequestState) -> None:
        """The request ended (its state as the runner drops it): a proposer that learns from
        earlier requests' outputs keeps what it needs."""


DRAFT_PROPOSERS = Registry("draft_proposer")
register_draft_proposer = DRAFT_PROPOSERS.register
