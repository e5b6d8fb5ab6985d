"""Progress for long loads: a tqdm bar on a terminal, silence otherwise (tests, pipes)."""

from __future__ import annotations

import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], desc: str) -> Iterable[T]:
    if not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="tensor", leave=False)
