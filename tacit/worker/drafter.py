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
from typing import Any, Protocol

import torch
from torch import nn

from tacit.config import EngineConfig, ModelConfig
from tacit.config.speculative import SpeculativeConfig
from tacit.loader import ModelSource
from tacit.platforms import Platform
from tacit.registry import Registry
from tacit.worker.request_state import CachedRequestState


class TargetRunner(Protocol):
    """What a proposer reads of the target's ModelRunner (which holds the proposer, so the
    proposer seam names these instead of importing it)."""

    config: EngineConfig  # its max_model_len capped to the pool
    num_blocks: int
    model: nn.Module
    paths_context: Any  # worker/paths/base.py's PathContext: block size, attention backend, device


@dataclass(frozen=True)
class DraftTarget:
    """What a proposer running layers of its own learns of the target it drafts for."""

    runner: TargetRunner  # the target's, its pool allocated
    source: ModelSource
    platform: Platform


class DraftProposer(ABC):
    # Seconds of the last propose()/advance() spent catching up on context the proposer had not
    # seen (a prompt's prefill through a draft model or MTP layer); the runner reports them apart.
    catch_up_s: float = 0.0

    @classmethod
    def pool_layers(
        cls, config: SpeculativeConfig, target: ModelConfig, source: ModelSource, device: torch.device, free_memory: int
    ) -> nn.Module | None:
        """Layers the proposer runs inside the target's KV pool (their KV cache layers get blocks
        beside the target's), built before the pool is sized; None: it needs none."""
        return None

    @classmethod
    def create(cls, config: SpeculativeConfig, target: DraftTarget | None) -> DraftProposer:
        """The proposer for this config (target None: a proposer that runs no model is built
        without one, as in tests of the proposer alone)."""
        return cls(config)

    @abstractmethod
    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        """{req_id: draft tokens to follow its last token}; a request left out (or given an
        empty list) decodes one token in its next step."""

    def observe(self, rows: list[tuple[CachedRequestState, int]], row_hidden: torch.Tensor) -> None:
        """Every token's final hidden states of the step just run (rows in scheduled order, each
        row's n tokens from its num_computed_tokens on, before the step settles), for a proposer
        whose config says uses_target_hidden_states (MTP drafts from them)."""

    def advance(self, requests: list[CachedRequestState]) -> None:
        """The step settled and no drafts are wanted this time: a proposer whose state follows
        every request's tokens (MTP's KV entries) brings it up to date."""

    def request_finished(self, state: CachedRequestState) -> None:
        """The request ended (its state as the runner drops it): a proposer that learns from
        earlier requests' outputs keeps what it needs."""


DRAFT_PROPOSERS = Registry("draft_proposer")
register_draft_proposer = DRAFT_PROPOSERS.register
