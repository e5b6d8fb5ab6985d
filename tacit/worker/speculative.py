"""The draft proposer --speculative-config names, built for the runner (one module imports every
proposer, so each registers, and nothing it imports imports it back)."""

from __future__ import annotations

from tacit.config.speculative import SpeculativeConfig
from tacit.worker.draft_model_proposer import DraftModelProposer
from tacit.worker.drafter import DRAFT_PROPOSERS, DraftProposer, DraftTarget
from tacit.worker.mtp_proposer import MTPProposer
from tacit.worker.ngram_proposer import NgramProposer
from tacit.worker.suffix_proposer import SuffixProposer

__all__ = ["DraftModelProposer", "MTPProposer", "NgramProposer", "SuffixProposer", "build_drafter", "drafter_class"]


def drafter_class(config: SpeculativeConfig) -> type[DraftProposer]:
    """The proposer class the config's method names."""
    return DRAFT_PROPOSERS.lookup(config.method)


def build_drafter(config: SpeculativeConfig | None, target: DraftTarget | None = None) -> DraftProposer | None:
    """The proposer the config names (None: one token a step), for the target it drafts for."""
    if config is None:
        return None
    return drafter_class(config).create(config, target)
