"""Driving a step that pauses at decoder-layer boundaries, as the online engine does."""

from __future__ import annotations

from typing import Callable, Generator, TypeVar

T = TypeVar("T")


def run_pausing(steps: Generator[None, None, T], at_pause: Callable[[], None]) -> T:
    """Run a pausable step to its end, calling at_pause() in every pause (a layer boundary)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        at_pause()
