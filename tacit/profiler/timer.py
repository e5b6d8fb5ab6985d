"""Exclusive wall time of nested spans, by (layer, category).

Why forward hooks and not torch.profiler: the profiler records every aten op (~1,500 in a
batch-1 decode step of the default model) and a trace per step to post-process, and its own
cost lands inside the ops it times; a pre/post hook pair on each module that does one class of
work reads perf_counter twice (~10 modules a layer), and the class is known from the module,
so no op-name mapping is needed. Nested spans count only their own time: an attention module's
span minus its projections' is rotary, the KV write and SDPA.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

from tacit.profiler.categories import HEAD


class SpanTimer:
    def __init__(self) -> None:
        # [category, layer, start, seconds of child spans, module with comm_seconds or None, its value at start]
        self._stack: list[list[Any]] = []
        self.times: dict[tuple[str, str], float] = defaultdict(float)

    def push(self, category: str, layer: str | None = None, comm_module: Any = None) -> None:
        """Open a span; layer None: the enclosing span's layer (HEAD outside any)."""
        if layer is None:
            layer = self._stack[-1][1] if self._stack else HEAD
        comm0 = comm_module.comm_seconds if comm_module is not None else 0.0
        self._stack.append([category, layer, time.perf_counter(), 0.0, comm_module, comm0])

    def pop(self) -> None:
        category, layer, start, children, comm_module, comm0 = self._stack.pop()
        total = time.perf_counter() - start
        own = total - children
        if comm_module is not None:
            # Seconds blocked in the module's collective: ModelRunner.communication_seconds()
            # reports them as communication, so they leave the module's own class.
            own -= comm_module.comm_seconds - comm0
        self.times[(layer, category)] += own
        if self._stack:
            self._stack[-1][3] += total

    def wrap(self, fn: Callable[..., Any], category: str, layer: str | None = None) -> Callable[..., Any]:
        """fn, its calls timed as one span of `category`."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.push(category, layer)
            try:
                return fn(*args, **kwargs)
            finally:
                self.pop()

        return timed

    def take(self) -> dict[tuple[str, str], float]:
        """The times since the last take, and a clean slate (a step that raised leaves spans open)."""
        out = dict(self.times)
        self.times.clear()
        self._stack.clear()
        return out
