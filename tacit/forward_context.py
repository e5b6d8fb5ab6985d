"""The one piece of global state: the attention metadata of the step being run.

The model runner builds it once per step; every attention layer reads it. Passing it through
every module's forward would make model code unreadable, and there is only ever one step in
flight per process.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

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


# Called between the decoder layers of the step in flight. The online engine installs one so a
# request that must start now (an interactive prompt arriving during a 200 ms loaded step) can
# be prefilled at the next layer boundary instead of after the whole step
# (Scheduler.schedule_cut_in, LLMEngine.cut_in_step).
_layer_hook: Callable[[], None] | None = None


@contextmanager
def set_layer_hook(hook: Callable[[], None] | None) -> Iterator[None]:
    global _layer_hook
    prev, _layer_hook = _layer_hook, hook
    try:
        yield
    finally:
        _layer_hook = prev


def has_layer_hook() -> bool:
    return _layer_hook is not None


def layer_boundary() -> None:
    """Run the layer hook, if any; the forward it may run inside has no hook of its own."""
    global _layer_hook
    hook = _layer_hook
    if hook is None:
        return
    _layer_hook = None
    try:
        hook()
    finally:
        _layer_hook = hook
