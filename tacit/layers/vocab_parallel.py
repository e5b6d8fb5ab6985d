"""The token-embedding table split over tensor-parallel ranks by vocabulary rows.

Rank r holds rows [r * V / N, (r + 1) * V / N); a lookup takes the ids in its range, zeroes the
rest, and one all-reduce sums the ranks' rows into every token's embedding (under data-parallel
attention, where each rank brings other ids, an all-gather of the ids and a reduce-scatter of
the rows). A vocabulary that
does not divide by N stays whole on every rank (replicated, no communication), as does its head.
"""

from __future__ import annotations

import torch
from torch import nn

from tacit.distributed.communicator import Communicator, exposed
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.layers.data_parallel import over_every_rank


def vocab_is_sharded(vocab_size: int, tp: TensorParallel) -> bool:
    return tp.size > 1 and vocab_size % tp.size == 0


class VocabParallelEmbedding(nn.Embedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TensorParallel = SINGLE) -> None:
        self.sharded = vocab_is_sharded(num_embeddings, tp)
        rows = num_embeddings // tp.size if self.sharded else num_embeddings
        super().__init__(rows, embedding_dim)
        # Only a sharded table joins ranks: checkpoint_shards and use_communicator read .tp.
        self.tp = tp if self.sharded else SINGLE
        self.vocab_start = tp.rank * rows if self.sharded else 0
        self.comm: Communicator | None = None
        self.comm_seconds = 0.0

    def checkpoint_shards(self, name: str) -> dict[str, tuple[int, int, int]]:
        return {f"{name}.weight": (0, self.vocab_start, self.num_embeddings)}

    def _rows_in_range(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the ids' embeddings, zeros for ids outside its slice."""
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = super().forward(local.masked_fill(outside, 0))
        return out.masked_fill_(outside.unsqueeze(-1), 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.sharded:
            return super().forward(ids)
        if self.tp.data_parallel:
            # Each rank brings its own requests' ids: every rank looks up all of them in its
            # slice and takes back the sums of its own (layers/data_parallel.py).
            return over_every_rank(self._rows_in_range, ids, self)
        out = self._rows_in_range(ids)
        exposed(self, lambda: self.comm.all_reduce(out))
        return out
