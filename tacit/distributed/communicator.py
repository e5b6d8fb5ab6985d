"""Communicator: the collectives a parallel step needs, on one group of ranks.

Every call is synchronous by default; with async_op=True it returns a CommHandle at once and
the collective runs while the caller computes (the overlap of the communication dimension),
its result ready after handle.wait(). TorchCommunicator (torch.distributed: gloo on CPU, NCCL
on GPU) is the reference; faster implementations register beside it and are tested against it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Callable, TypeVar

import torch

from tacit.registry import Registry

T = TypeVar("T")


class CommHandle:
    """An issued collective; wait() blocks until it is done and returns its result. After it,
    hidden_s is the time from issue to wait() (communication that could run beside the caller's
    own work) and exposed_s the time wait() blocked: the overlap a caller achieved, measured."""

    def __init__(self, wait: Callable[[], torch.Tensor | None]) -> None:
        self._wait = wait
        self._done = False
        self._result: torch.Tensor | None = None
        self._issued = time.perf_counter()
        self.hidden_s = self.exposed_s = 0.0

    def wait(self) -> torch.Tensor | None:
        if not self._done:
            start = time.perf_counter()
            self._result = self._wait()
            self._done = True
            self.hidden_s, self.exposed_s = start - self._issued, time.perf_counter() - start
        return self._result

    @staticmethod
    def completed(result: torch.Tensor | None) -> "CommHandle":
        handle = CommHandle(lambda: result)
        handle.wait()
        return handle


class Communicator(ABC):
    """Collectives over `world_size` ranks; this process is `rank`. Tensors are contiguous and
    on this communicator's device; every rank calls the same collectives in the same order."""

    name: str
    rank: int
    world_size: int

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> torch.Tensor | CommHandle:
        """Sum `tensor` over the ranks, in place; returns it (or a handle whose wait() does)."""

    @abstractmethod
    def all_gather(self, tensor: torch.Tensor, dim: int = 0, async_op: bool = False) -> torch.Tensor | CommHandle:
        """Every rank's `tensor` concatenated along `dim` in rank order (same shape on every rank)."""

    @abstractmethod
    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0, async_op: bool = False) -> torch.Tensor | CommHandle:
        """The sum over ranks of `tensor`, split along `dim` in world_size equal parts: this rank's part."""

    @abstractmethod
    def all_to_all(
        self,
        tensor: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        async_op: bool = False,
    ) -> torch.Tensor | CommHandle:
        """Rows [sum(input_split_sizes[:r]), +input_split_sizes[r]) of `tensor` go to rank r; the
        result holds output_split_sizes[r] rows from each rank r, in rank order (uneven splits)."""

    @abstractmethod
    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False) -> CommHandle | None:
        """Send `tensor` to rank dst (which calls recv with a tensor of the same shape and dtype)."""

    @abstractmethod
    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> torch.Tensor | CommHandle:
        """Receive into `tensor` from rank src; returns it."""

    def c_all_reduce_f32(self) -> tuple[int, int] | None:
        """(function address, context address) of a C all-reduce that compiled code (the fused
        decode step) calls with no Python in between, or None. The function: int fn(void* ctx,
        void* data, int64_t numel, int dtype_code, char* err, int64_t err_len), 0 on success;
        the fused step passes float32 buffers (dtype_code 0)."""
        return None

    @classmethod
    def create(cls, backend: str | None) -> Communicator:
        """This rank's communicator for the whole tensor-parallel world, as every rank builds it
        (collectively). backend: the accelerator's torch.distributed backend for the data path
        ("nccl"), or None on CPU, where the world's gloo group carries it."""
        return cls()

    def barrier(self) -> None:
        self.all_reduce(torch.zeros(1))

    def close(self) -> None:
        """Release what the communicator holds (shared memory, buffers)."""


COMMUNICATORS = Registry("communicator")
register_communicator = COMMUNICATORS.register


def split_sizes_check(sizes: list[int], world_size: int, rows: int, what: str) -> None:
    """A clear error for all_to_all split lists that do not describe `rows` rows over the ranks."""
    if len(sizes) != world_size or any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise ValueError(
            f"all_to_all {what}={sizes}: needs {world_size} non-negative sizes summing to the tensor's {rows} rows"
        )


def exposed(owner: Any, collective: Callable[[], T]) -> T:
    """Run a blocking collective and add the seconds it took to owner.comm_seconds: the
    communication a layer exposes (the caller waits for it), per module, for the profiler."""
    start = time.perf_counter()
    out = collective()
    owner.comm_seconds += time.perf_counter() - start
    return out
