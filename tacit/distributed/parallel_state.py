"""Which shard of a tensor-parallel model this process holds.

Layers are built with a TensorParallel (rank, size) and split their weights by it; the
Communicator that joins the shards is bound after loading (layers/linear.use_communicator), as
linear methods and attention backends are, so no layer reads a process-wide group.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorParallel:
    """rank of size; expert_parallel: MoE layers hold 1/size of the experts, whole, instead of
    1/size of every expert's intermediate features (attention and dense MLPs split as always);
    data_parallel_attention: attention whole on every rank (`attention`), each rank attending
    over its own requests; the MLPs, the embedding and the head split over all ranks' tokens."""

    rank: int = 0
    size: int = 1
    expert_parallel: bool = False
    data_parallel_attention: bool = False

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} of size {self.size} is invalid")

    @property
    def attention(self) -> "TensorParallel":
        """How the attention layers split: like everything else, or not at all under
        data-parallel attention (each rank holds them whole)."""
        return SINGLE if self.data_parallel_attention else self

    @property
    def data_parallel(self) -> bool:
        """Whether this rank attends over its own requests only (data-parallel attention)."""
        return self.data_parallel_attention and self.size > 1

    def split(self, total: int, what: str) -> int:
        """This rank's share of `total` (heads, rows, experts), refusing a size that does not divide it."""
        if total % self.size:
            raise ValueError(
                f"tensor_parallel_size={self.size} does not divide {what}={total}: each rank needs an equal share; "
                f"use a tensor_parallel_size that divides {total}"
            )
        return total // self.size

    def part(self, total: int, what: str) -> tuple[int, int]:
        """(start, length) of this rank's equal share of `total`."""
        n = self.split(total, what)
        return self.rank * n, n


SINGLE = TensorParallel()
