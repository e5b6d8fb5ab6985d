"""How unevenly a trained router loads expert-parallel ranks: the busiest rank's routed pairs
over the mean rank's, which every MoE layer waits for.

A trained router does not pick experts uniformly. TensorRT-LLM counted DeepSeek-R1's routing on
32 GB200 GPUs, a local batch of 256 decodes (1024 routed pairs a rank on average), each figure
the mean over layers and iterations (NVIDIA TensorRT-LLM, docs/source/blogs/tech_blog/
blog4_Scaling_Expert_Parallelism_in_TensorRT-LLM.md, table 1; imbalance ratio = (max - mean) /
mean):

    256 experts, 8 a rank, no EPLB      by rank: std 491.6, ratio 1.564   by expert: std 164.1 of 128, ratio 10.948
    288 slots (EPLB), 9 a rank, EP 32   by rank: std 52.0,  ratio 0.109
    288 slots (EPLB), 8 a rank, EP 36   by rank: std 53.9,  ratio 0.115

Two terms reproduce them. Without redundant experts, each expert's popularity is lognormal
(POPULARITY_SIGMA) and experts sit on ranks in index order, so a rank's load is the sum of its
experts' popularities: sigma 1.064 gives 32 ranks of 8 the busiest at 2.564x the mean (solved:
scripts/routing_skew_fit.py), and then by-rank std 0.484 of the mean (table 0.480), by-expert
std 1.40 (1.28) and busiest expert 12.8x (11.9) follow: checks, not fitted. With redundant experts
EPLB places replicas against the measured loads, and what is left is each rank's drift from the
plan between iterations (EPLB_DRIFT, a relative std): the EPLB rows' by-rank std less the
sampling noise of 1024 pairs, sqrt(0.0508^2 - 1/1024) = 0.040 and sqrt(0.0526^2 - 1/1024) =
0.042. On both, a step's pairs are Poisson draws around each rank's share, so a small batch is
lumpier still. The numbers are DeepSeek-R1's; other routers are priced as if alike.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

POPULARITY_SIGMA = 1.064
EPLB_DRIFT = 0.041
# routing draws averaged, one seed: across 8 seeds the mean moves 0.2% with EPLB and 1.3-5.4%
# without it (32 ranks of 8 experts 4.0%, 64 of 4 5.4%: the hottest expert's draw dominates)
TRIALS = 512


def busiest_rank_load(experts: int, ranks: int, slots: int, picks_per_rank: float) -> float:
    """The busiest of `ranks` EP ranks' routed pairs over the mean rank's, `slots` expert copies
    over them (slots > experts: EPLB's redundant experts), `picks_per_rank` pairs a rank on
    average this step."""
    if ranks <= 1:
        return 1.0
    mean = float(f"{max(picks_per_rank, 1e-3):.3g}")  # 3 significant digits: one cache entry a batch size
    return skewed_busiest(experts, ranks, slots, mean, POPULARITY_SIGMA, EPLB_DRIFT)


def expert_popularity(rng: np.random.Generator, trials: int, experts: int, sigma: float) -> np.ndarray:
    """`trials` draws of each expert's share of the routed pairs over the mean expert's: lognormal
    with spread `sigma`, each draw normalized to mean 1."""
    popularity = rng.lognormal(-sigma * sigma / 2, sigma, (trials, experts))
    return popularity / popularity.mean(axis=1, keepdims=True)


@lru_cache(maxsize=4096)
def skewed_busiest(experts: int, ranks: int, slots: int, mean: float, sigma: float, drift: float) -> float:
    """busiest_rank_load under a popularity spread `sigma` and an EPLB drift `drift`: the mean of
    TRIALS routing draws (seeded: the same numbers every call)."""
    rng = np.random.default_rng(0)
    held = math.ceil(slots / ranks)
    if slots > experts:  # EPLB: every rank's share at the plan, give or take its drift
        share = np.clip(1 + drift * rng.standard_normal((TRIALS, ranks)), 0.0, None)
        share *= held / (slots / ranks)  # a rank holding more slots than the mean
    else:  # experts in index order, `held` a rank (the last ranks fewer where EP does not divide them)
        padded = np.zeros((TRIALS, held * ranks))
        padded[:, :experts] = expert_popularity(rng, TRIALS, experts, sigma)
        share = padded.reshape(TRIALS, ranks, held).sum(axis=2) / (experts / ranks)
    pairs = rng.poisson(share * mean)
    return float(pairs.max(axis=1).mean() / mean)
