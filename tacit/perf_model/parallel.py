"""Collective time from a device's link bandwidth and per-step latency (ring algorithms)."""

from __future__ import annotations


def collective_seconds(kind: str, message_bytes: float, ranks: int, link_bw: float, latency: float) -> float:
    """One collective of `message_bytes` per rank among `ranks`.
    all_reduce (ring: reduce-scatter + all-gather): 2(N-1)/N of the bytes cross each link in
    2(N-1) steps. all_gather and reduce_scatter (message_bytes: the whole gathered / scattered
    tensor): (N-1)/N in N-1 steps. all_to_all: each rank sends (N-1)/N of its bytes to the
    others, N-1 steps."""
    if ranks <= 1:
        return 0.0
    n = ranks
    if kind == "all_reduce":
        return 2 * (n - 1) / n * message_bytes / link_bw + latency * 2 * (n - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * message_bytes / link_bw + latency * (n - 1)
    raise ValueError(f"collective {kind!r} is not known; valid: all_reduce, all_gather, reduce_scatter, all_to_all")
