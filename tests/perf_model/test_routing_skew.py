"""The busiest EP rank's load as a trained router gives it (routing_skew.py): TensorRT-LLM's
DeepSeek-R1 routing counts reproduced, EPLB's redundant experts bringing the busiest rank near
the mean, and a small batch lumpier than a large one."""

from __future__ import annotations

import pytest

from tacit.perf_model.routing_skew import busiest_rank_load
from tests.script_module import load_script

# TensorRT-LLM tech blog 4, table 1: 1 + the by-rank imbalance ratio at 1024 pairs a rank.
# Within 2%: the mean of 512 seeded draws (the figure the constants were solved on is exact by
# construction; the EPLB rows share one drift, 0.040 and 0.042 solved apart)
TABLE = ((256, 32, 256, 2.564), (256, 32, 288, 1.109), (256, 36, 288, 1.115))


@pytest.mark.parametrize(("experts", "ranks", "slots", "busiest"), TABLE)
def test_the_published_routing_counts_are_reproduced(experts, ranks, slots, busiest):
    assert busiest_rank_load(experts, ranks, slots, 1024) == pytest.approx(busiest, rel=0.02)


def test_the_shipped_spread_is_what_the_fit_solves():
    fit = load_script("routing_skew_fit")
    from tacit.perf_model.routing_skew import POPULARITY_SIGMA

    assert fit.solve_sigma() == pytest.approx(POPULARITY_SIGMA, abs=0.002)


def test_one_rank_is_the_mean_and_the_draws_are_the_same_every_call():
    assert busiest_rank_load(256, 1, 256, 10) == 1.0
    assert busiest_rank_load(256, 16, 256, 300) == busiest_rank_load(256, 16, 256, 300.0004)


def test_a_small_batch_is_lumpier_and_more_ranks_wait_on_a_hotter_one():
    # 8 pairs a rank: a few tokens on a hot expert decide the busiest rank
    assert busiest_rank_load(256, 32, 256, 8) > busiest_rank_load(256, 32, 256, 1024)
    assert busiest_rank_load(256, 32, 288, 8) > busiest_rank_load(256, 32, 288, 1024)
    # fewer experts a rank: the hottest expert weighs more in its rank's sum
    assert busiest_rank_load(256, 64, 256, 1024) > busiest_rank_load(256, 16, 256, 1024)


def test_a_rank_holding_more_experts_than_the_mean_carries_their_share():
    # 10 experts over 4 ranks: 3, 3, 3, 1 (the mean rank 2.5); 12 EPLB slots: 3 each
    assert busiest_rank_load(10, 4, 10, 1e4) > 3 / 2.5
    assert busiest_rank_load(10, 4, 12, 1e4) < 1.1
