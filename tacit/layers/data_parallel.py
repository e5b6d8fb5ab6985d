"""Data-parallel attention: the two collectives around each MLP.

Each rank attends over its own requests' tokens with the whole attention (and its own KV pool);
an MLP split over the ranks (by feature, or by expert) needs every rank's tokens. So before
the MLP the ranks' rows are all-gathered, each rank runs its share of the MLP on all of them,
and a reduce-scatter sums the shares and hands each rank back its own rows.

Why all-gather + reduce-scatter and not an all-to-all that sends each token only to the ranks
holding its experts: a token whose top_k experts fall uniformly over N ranks reaches
N * (1 - (1 - 1/N) ** top_k) of them, 1.992 of 2 ranks at top_k = 8 (DeepSeek-V3, Qwen3-MoE),
so a dispatch would move 0.4% fewer bytes than the all-gather, at the price of a routing-
dependent split every layer; and a dense MLP (DeepSeek's first layers, a shared expert),
split by feature, needs every token on every rank anyway.

Ranks bring different token counts (counts, in rank order, the same list on every rank); the
collectives take equal shapes, so each rank pads its rows to the largest count.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from tacit.distributed.communicator import Communicator, exposed
from tacit.forward_context import get_dp_metadata


def _real_rows(counts: tuple[int, ...], most: int) -> torch.Tensor:
    """Where each rank's real rows sit among the padded rows (rank r's at r * most onwards)."""
    return torch.cat([torch.arange(r * most, r * most + c) for r, c in enumerate(counts)])


def gather_tokens(x: torch.Tensor, counts: tuple[int, ...], comm: Communicator) -> torch.Tensor:
    """Every rank's rows in rank order, [sum(counts), hidden]; x is this rank's counts[rank] rows."""
    most = max(counts)
    if len(x) != counts[comm.rank]:
        raise ValueError(f"rank {comm.rank} brings {len(x)} rows, but the step says {counts[comm.rank]}")
    padded = x if len(x) == most else torch.cat([x, x.new_zeros((most - len(x), *x.shape[1:]))])
    everything = comm.all_gather(padded.contiguous())
    return everything if min(counts) == most else everything[_real_rows(counts, most)]


def scatter_sums(y: torch.Tensor, counts: tuple[int, ...], comm: Communicator) -> torch.Tensor:
    """This rank's rows of the sum over ranks of y, every rank's partial result for all the
    gathered rows ([sum(counts), hidden])."""
    most = max(counts)
    if min(counts) == most:
        padded = y
    else:
        padded = y.new_zeros((most * len(counts), *y.shape[1:]))
        padded[_real_rows(counts, most)] = y
    return comm.reduce_scatter(padded.contiguous())[: counts[comm.rank]]


def over_every_rank(share: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, owner: nn.Module) -> torch.Tensor:
    """This rank's rows of a split layer applied to every rank's rows: x (this rank's rows, ids
    or hidden states) gathered, share (this rank's part of the layer: partial sums) run on all of
    them, the sums scattered back. The MLPs use it, and the vocabulary-split embedding. owner:
    the module whose .comm joins the ranks and whose comm_seconds counts the time blocked."""
    counts = get_dp_metadata().num_tokens_across_dp
    everyone = exposed(owner, lambda: gather_tokens(x, counts, owner.comm))
    partial = share(everyone)
    return exposed(owner, lambda: scatter_sums(partial, counts, owner.comm))
