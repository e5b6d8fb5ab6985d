"""The one piece of global state: the attention metadata of the step being run.

The model runner builds it once per step; every attention layer reads it. Passing it through
every module's forward would make model code unreadable, and there is only ever one step in
flight per process.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from tacit.kernels.attention_backend import AttentionMetadata  # each backend subclasses it

_context: AttentionMetadata | None = None


@contextmanager
def set_forward_context(meta: AttentionMetadata) -> Iterator[None]:
    global _context
    prev, _context = _context, meta
    try:
        yield
    finally:
        _context = prev


def get_attention_metadata() -> AttentionMetadata:
    if _context is None:
        raise RuntimeError("attention called outside a model-runner step (no forward context set)")
    return _context
