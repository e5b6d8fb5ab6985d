"""The profiler's roofline counts a sliding-window layer's attention over its window, not its
context: attended_pairs against a per-query count."""

import pytest

from tacit.profiler.roofline import attended_pairs


@pytest.mark.parametrize("window", [None, 1, 4, 7, 100])
def test_attended_pairs_count_each_querys_visible_keys(window):
    for c in range(0, 12):
        for n in range(1, 10):
            # query j sits at position c + j and sees positions up to itself, the last `window` of them
            want = sum(c + j + 1 if window is None else min(c + j + 1, window) for j in range(n))
            assert attended_pairs(n, c, window) == want, (n, c, window)
