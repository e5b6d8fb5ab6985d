"""One step's paged-cache bookkeeping for backend tests: shuffled block tables and slots."""

from __future__ import annotations

from typing import Callable

import numpy as np


def paged_step(
    step: list[tuple[int, int]], block_size: int, num_blocks: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Callable[[int, np.ndarray], np.ndarray], np.ndarray, int]:
    """step: (computed, new) tokens per request -> (num_new, computed, block tables [R, B],
    slots(request, positions), slot_mapping [T], num_blocks); the blocks are drawn shuffled from a
    pool of num_blocks (None: just enough, plus 3)."""
    g = np.random.default_rng(seed)
    computed = np.array([c for c, _ in step], dtype=np.int64)
    num_new = np.array([n for _, n in step], dtype=np.int64)
    need = -(-(computed + num_new) // block_size)
    if num_blocks is None:
        num_blocks = int(need.sum()) + 3
    free = g.permutation(num_blocks)
    tables = np.zeros((len(step), int(need.max())), dtype=np.int64)
    start = 0
    for i, b in enumerate(need):
        tables[i, :b] = free[start : start + b]
        start += b

    def slots(i: int, positions: np.ndarray) -> np.ndarray:
        return tables[i, positions // block_size] * block_size + positions % block_size

    slot_mapping = np.concatenate([slots(i, np.arange(c, c + n)) for i, (c, n) in enumerate(step)])
    return num_new, computed, tables, slots, slot_mapping, num_blocks
