"""`tacit serve --adaptive` and its bounds: listed in the frontend help, read into AdaptiveBounds,
and a bound given without --adaptive refused rather than ignored."""

from __future__ import annotations

import pytest

from tacit.cli import build_parser, parse_args
from tacit.entrypoints.adaptive_args import adaptive_bounds
from tacit.scheduling.adaptive import AdaptiveBounds


def test_serve_help_lists_adaptive_in_the_frontend_group(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(build_parser(), ["serve", "--help=frontend"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for flag in ("--adaptive ", "--adaptive-tpot-ms", "--adaptive-min-batched-tokens", "--adaptive-max-long-prefill"):
        assert flag in out


def test_flags_become_bounds_and_stay_off_by_default():
    parser = build_parser()
    assert adaptive_bounds(parse_args(parser, ["serve"])) is None
    args = parse_args(
        parser, ["serve", "--adaptive", "--adaptive-tpot-ms", "150", "--adaptive-max-batched-tokens", "4096"]
    )
    assert adaptive_bounds(args) == AdaptiveBounds(tpot_ms=150.0, max_batched_tokens=4096)
    assert adaptive_bounds(parse_args(parser, ["serve", "--adaptive"])) == AdaptiveBounds()


def test_a_bound_without_adaptive_is_an_error():
    args = parse_args(build_parser(), ["serve", "--adaptive-tpot-ms", "100", "--adaptive-min-long-prefill", "64"])
    with pytest.raises(ValueError, match="--adaptive-tpot-ms, --adaptive-min-long-prefill set without --adaptive"):
        adaptive_bounds(args)
