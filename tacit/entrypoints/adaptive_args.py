"""`tacit serve --adaptive` and its bounds: flags in the frontend group, read into AdaptiveBounds
(tacit/scheduling/adaptive.py explains the controller; what a flag leaves out is derived from the
engine's scheduler config once it is built)."""

from __future__ import annotations

import argparse

from tacit.scheduling.adaptive import AdaptiveBounds

# flag -> AdaptiveBounds field, type, help
_BOUNDS = (
    (
        "--adaptive-tpot-ms",
        "tpot_ms",
        float,
        "the inter-token latency target steps are sized for, ms "
        "(default: the tightest tpot_ms of the slo_classes; one of the two is needed)",
    ),
    ("--adaptive-min-batched-tokens", "min_batched_tokens", int, "the lowest step token budget (default 256)"),
    (
        "--adaptive-max-batched-tokens",
        "max_batched_tokens",
        int,
        "the highest step token budget (default 4 x --max-num-batched-tokens)",
    ),
    ("--adaptive-min-long-prefill", "min_long_prefill", int, "the lowest long-prefill cap (default 128)"),
    (
        "--adaptive-max-long-prefill",
        "max_long_prefill",
        int,
        "the highest long-prefill cap (default and most: --max-num-batched-tokens)",
    ),
)


def add_adaptive_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--adaptive",
        action="store_true",
        help="move the step token budget and the long-prefill cap within bounds from the live queue and the "
        "measured step times, to keep decodes within a TPOT target (off by default; decisions in /metrics as "
        "tacit_adaptive_decisions_total and logged)",
    )
    for flag, _, kind, text in _BOUNDS:
        group.add_argument(flag, type=kind, default=None, metavar="MS" if kind is float else "N", help=text)


def adaptive_bounds(args: argparse.Namespace) -> AdaptiveBounds | None:
    """The --adaptive-* flags as AdaptiveBounds; None without --adaptive (a bound without it is
    an error, not silently ignored)."""
    given = {field: getattr(args, flag[2:].replace("-", "_")) for flag, field, _, _ in _BOUNDS}
    if not getattr(args, "adaptive", False):
        stray = [flag for flag, field, _, _ in _BOUNDS if given[field] is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} set without --adaptive: add --adaptive, or drop them")
        return None
    return AdaptiveBounds(**given)
