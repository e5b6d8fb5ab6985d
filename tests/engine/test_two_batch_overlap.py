"""Two-micro-batch overlap's pieces that need no second process: where a step is cut, and the
configurations refused (the overlapped runs themselves: tests/distributed/test_tensor_parallel.py)."""

import pytest

from tacit.config import ParallelConfig
from tacit.worker.paths.two_batch_overlap import split_point


@pytest.mark.parametrize(
    "tokens, cut",
    [
        ([1, 1], 1),
        ([1, 1, 1, 1], 2),
        ([100, 1, 1, 1], 1),  # one long prefill against three decodes: as near half as whole requests go
        ([1, 1, 1, 100], 3),
        ([30, 30, 40], 2),  # 60 | 40 is nearer half than 30 | 70
        ([64, 1], 1),
    ],
)
def test_split_point_balances_tokens_and_keeps_both_halves(tokens, cut):
    assert split_point(tokens) == cut
    assert 1 <= cut < len(tokens)


def test_one_request_cannot_be_split():
    with pytest.raises(ValueError, match="at least 2 requests"):
        split_point([5])


def test_two_batch_overlap_needs_tensor_parallel():
    with pytest.raises(ValueError, match="two_batch_overlap=true needs tensor_parallel_size >= 2"):
        ParallelConfig(tensor_parallel_size=1, two_batch_overlap=True)
    with pytest.raises(ValueError, match="two_batch_overlap='yes' is invalid"):
        ParallelConfig(tensor_parallel_size=2, two_batch_overlap="yes")
    assert ParallelConfig(tensor_parallel_size=2, two_batch_overlap=True).two_batch_overlap
