"""ParallelConfig: how many processes run the model, and how they split it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelConfig:
    """How many processes run the model: tensor_parallel_size ranks, each holding 1/N of every
    layer's heads and features (tacit/distributed/, engine/executor.py)."""

    tensor_parallel_size: int = 1
    # MoE layers: each rank holds 1/N of the experts, whole, instead of 1/N of every expert.
    expert_parallel: bool = False
    # Torch-path steps of 2+ requests run as two micro-batches, each one's all-reduces in flight
    # while the other computes (worker/paths/two_batch_overlap.py). Off by default: on a CPU whose
    # ranks have one core each, the transfer and the other half's compute share that core.
    two_batch_overlap: bool = False
    # Attention data-parallel (SGLang's --enable-dp-attention): each rank holds the whole attention
    # and serves its own requests with its own KV pool, so MLA's latent cache is split by request
    # instead of copied on every rank; the MLPs stay split and run on all ranks' tokens, gathered
    # (layers/data_parallel.py).
    data_parallel_attention: bool = False
    # The Communicator the ranks' collectives run on: "auto" (the platform's default) or a name
    # in distributed/communicator.py's registry (checked by EngineArgs, which sees the registry).
    communicator: str = "auto"
    # Torch's intra-op threads, which the C++ kernels' OpenMP loops also take (at::get_num_threads), per
    # process: llama.cpp's --threads. None: torch's own in one process; one per core of a rank's share.
    threads: int | None = None

    def __post_init__(self) -> None:
        n = self.tensor_parallel_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"tensor_parallel_size={n!r} is invalid: must be an integer >= 1")
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ValueError(f"threads={t!r} is invalid: must be an integer >= 1 (or unset: torch's own)")
        for flag in ("expert_parallel", "two_batch_overlap", "data_parallel_attention"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}={getattr(self, flag)!r} is invalid: must be true or false")
        if self.two_batch_overlap and n == 1:
            raise ValueError(
                "two_batch_overlap=true needs tensor_parallel_size >= 2: one process has no communication to overlap"
            )
        if self.data_parallel_attention and n == 1:
            raise ValueError(
                "data_parallel_attention=true needs tensor_parallel_size >= 2: it spreads requests over the ranks"
            )
        if self.data_parallel_attention and self.two_batch_overlap:
            raise ValueError(
                "data_parallel_attention and two_batch_overlap cannot be combined: each rank's step is already "
                "its own requests; pick one"
            )
