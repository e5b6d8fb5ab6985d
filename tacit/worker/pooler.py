"""Embedding requests in the model runner: each step's final hidden states of a pooling request's
prompt rows are folded into its pool (a float32 running sum, the first row, the last row), and
the vector is made once its prefill ends (PoolingParams: LAST, MEAN or CLS, then the first
`dimensions` values, then the L2 normalisation). Chunked prefill and preemption change nothing:
a chunk that starts the prompt again (a recompute) starts the pool again."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tacit.pooling_params import PoolingParams
from tacit.worker.input_batch import Rows


@dataclass
class PoolState:
    total: torch.Tensor | None = None
    count: int = 0
    first: torch.Tensor | None = None
    last: torch.Tensor | None = None


def pool_rows(states: dict[str, PoolState], rows: Rows, row_hidden: torch.Tensor) -> dict[str, list[float]]:
    """Fold the step's rows of pooling requests into their pools (row_hidden: every token's final
    hidden states, rows in order); {req_id: embedding} of those whose prompt this step ended."""
    out: dict[str, list[float]] = {}
    start = 0
    for r, n in rows:
        params = r.sampling_params.pooling
        if params is not None:
            h = row_hidden[start : start + n].float()
            computed = r.num_computed_tokens
            if computed == 0 or r.req_id not in states:
                states[r.req_id] = PoolState()
            s = states[r.req_id]
            s.total = h.sum(dim=0) if s.total is None else s.total + h.sum(dim=0)
            s.count += n
            if computed == 0:
                s.first = h[0].clone()
            s.last = h[-1].clone()
            if computed + n == r.num_tokens:
                out[r.req_id] = embedding(params, states.pop(r.req_id))
        start += n
    return out


def embedding(params: PoolingParams, s: PoolState) -> list[float]:
    if params.pooling_type == "MEAN":
        vec = s.total / s.count
    elif params.pooling_type == "CLS":
        vec = s.first
    else:
        vec = s.last
    if params.dimensions is not None:
        vec = vec[: params.dimensions]
    if params.normalize:
        vec = torch.nn.functional.normalize(vec, dim=0)
    return vec.tolist()
