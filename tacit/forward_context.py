"""The one piece of global state: the metadata of the step being run.

The model runner builds it once per step; every attention layer reads its attention metadata,
and under data-parallel attention every decoder layer reads how many tokens each rank brings.
Passing them through every module's forward would make model code unreadable, and there is
only ever one step in flight per process.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from tacit.kernels.attention_backend import AttentionMetadata  # each backend subclasses it


@dataclass(frozen=True)
class DataParallelMetadata:
    """Data-parallel attention (vLLM's DPMetadata): the tokens each rank runs this step, in rank
    order. Every rank derives the same list from the step's SchedulerOutput, so no collective
    is spent agreeing on it."""

    num_tokens_across_dp: tuple[int, ...]


# One metadata, or one per KV cache group (each group reads its own block tables).
_context: AttentionMetadata | tuple[AttentionMetadata, ...] | None = None
_dp_context: DataParallelMetadata | None = None


@contextmanager
def set_forward_context(
    meta: AttentionMetadata | tuple[AttentionMetadata, ...] | None, dp: DataParallelMetadata | None = None
) -> Iterator[None]:
    """meta: the step's attention metadata, a tuple of one per KV cache group when the model
    has several (sliding-window beside full layers). None: this rank has no tokens of its own
    this step (data-parallel attention), so its layers attend over nothing and only join the
    other ranks' MLP collectives."""
    global _context, _dp_context
    prev, _context = _context, meta
    prev_dp, _dp_context = _dp_context, dp
    try:
        yield
    finally:
        _context, _dp_context = prev, prev_dp


def get_attention_metadata(group: int = 0) -> AttentionMetadata:
    """The metadata of KV cache group `group` (the layer's kv_cache_group)."""
    if _context is None:
        raise RuntimeError("attention called outside a model-runner step (no forward context set)")
    return _context[group] if isinstance(_context, tuple) else _context


def get_dp_metadata() -> DataParallelMetadata:
    if _dp_context is None:
        raise RuntimeError("a data-parallel decoder layer ran outside a data-parallel step (no DataParallelMetadata)")
    return _dp_context
