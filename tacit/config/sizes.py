"""Sizes with units, as users write them on a command line: `2GiB`, `512MiB`, `1.5GB`, `4096`.

Every unit is binary, KB as KiB (1024): memory is sized in powers of two, as llama.cpp, vLLM's
upper-case suffixes (its human_readable_int) and `tacit bench comm --sizes 16KB` read them, so
`--kv-cache-memory 2GB` and `2GiB` are the same pool. The case of the unit does not matter.
"""

from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgt", start=1):
    _UNITS.update({_letter: 1 << (10 * _i), _letter + "b": 1 << (10 * _i), _letter + "ib": 1 << (10 * _i)})
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")
VALID_SIZES = "a byte count (4096) or a number with a unit: 2GiB, 512MiB, 1.5GB (K M G T, KB or KiB: all binary)"


def parse_size(text: str, unit: int = 1) -> float:
    """The size of "2GiB", "1.5GB" or "4096" in `unit`s (1: bytes; 1 << 30: GiB); a plain number is
    already in `unit`s. Raises ValueError naming the text and the valid forms."""
    m = _SIZE.fullmatch(text)
    suffix = m.group(2).lower() if m else None
    if m is None or suffix not in _UNITS:
        raise ValueError(f"{text!r} is not a size; valid: {VALID_SIZES}")
    value = float(m.group(1))
    return value * _UNITS[suffix] / unit if suffix else value


def parse_bytes(text: str) -> int:
    """argparse type of the byte-count flags: "2GiB" -> 2147483648, "4096" -> 4096."""
    try:
        size = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not size.is_integer() and not re.search("[a-zA-Z]", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes; valid: {VALID_SIZES}")
    return round(size)


def parse_gib(text: str) -> float:
    """argparse type of the flags counted in GiB: "512MiB" -> 0.5, "4" -> 4.0."""
    try:
        return parse_size(text, 1 << 30)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
