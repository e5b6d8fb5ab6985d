"""The draft proposer --speculative-config names, built for the runner (one module imports every
proposer, so each registers, and nothing it imports imports it back)."""

from __future__ import annotations

from tacit.config.speculative import SpeculativeConfig
from tacit.worker.drafter import DRAFT_PROPOSERS, DraftProposer
from tacit.worker.ngram_proposer import NgramProposer
from tacit.worker.suffix_proposer import SuffixProposer

__all__ = ["NgramProposer", "SuffixProposer", "build_drafter"]


def build_drafter(config: SpeculativeConfig | None) -> DraftProposer | None:
    """The proposer the config names (None: one token a step)."""
    if config is None:
        return None
    return DRAFT_PROPOSERS.lookup(config.method)(config)
