"""Prometheus text exposition (format 0.0.4), written by hand: no client library needed.

A histogram takes a lock (an observation is a few adds; rendering copies the buckets). The
writers emit what prometheus_client would for the same metric: a counter's samples and its
HELP/TYPE lines carry the `_total` suffix, a histogram's `_bucket{le=...}` (cumulative, up to
`+Inf`), `_sum` and `_count`.
"""

from __future__ import annotations

import threading
from bisect import bisect_left


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        """count observations of value at once (a step's accepted drafts share one gap)."""
        with self._lock:
            self._counts[bisect_left(self.buckets, value)] += count
            self._sum += value * count

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self._counts), self._sum


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_metric(lines: list[str], name: str, kind: str, help_text: str, labels: str, value: float) -> None:
    """One gauge or counter sample; a counter's name gets `_total` unless it has it already."""
    if kind == "counter" and not name.endswith("_total"):
        name += "_total"
    lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"])


def write_histogram(lines: list[str], name: str, help_text: str, labels: str, hist: Histogram) -> None:
    counts, total = hist.snapshot()
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    cumulative = 0
    for bound, n in zip((*hist.buckets, float("inf")), counts):
        cumulative += n
        le = "+Inf" if bound == float("inf") else _go_float(bound)
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {cumulative}"]


def _go_float(value: float) -> str:
    """A bucket bound as prometheus_client's floatToGoString writes it: Python's repr, except
    that from 1,000,000 on Go's exponent form ("1e+06"), as a 1M-token max_model_len needs."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[:dot]}.{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text
