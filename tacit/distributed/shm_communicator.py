"""A Communicator for ranks on one host, over one POSIX shared-memory segment (csrc/shm_comm.cpp):
no sockets, no kernel on the data path, so a decode step's small all-reduce costs microseconds
where gloo over loopback costs hundreds (16 KB bf16, 2 ranks: ~7 us against ~1 ms on a 2-core
VM; `tacit bench comm` measures both).

The segment's name is agreed through the torch.distributed group at construction and unlinked
as soon as every rank has mapped it, so /dev/shm keeps nothing even if the ranks are killed.
A rank waiting for a peer that died raises RuntimeError naming it (checked every ~1 ms).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch
import torch.distributed as dist

from tacit.distributed.communicator import CommHandle, Communicator, register_communicator, split_sizes_check
from tacit.distributed.shm_kernels import load_shm_kernels

# The codes of tacit_shm_all_reduce's dtype_code argument (csrc/shm_comm.h: DType).
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

# Per rank, two slots of this size (by parity of the exchange) plus 1 MiB channels per rank pair:
# 2 ranks hold 2 * 2 * 4 + 4 = 20 MiB of /dev/shm. Larger tensors go through in chunks.
DEFAULT_BUFFER_BYTES = 4 << 20
# all_reduce chunks of at least this many bytes are summed reduce-scatter style (each rank sums
# 1/N, then copies the others' parts back); smaller ones one-shot (each rank sums everything).
# 2 ranks, bf16, us per call, one-shot vs two-shot, medians on a 2-core EPYC VM shared with other
# work (noisy): 16 KB 38 vs 70, 256 KB 98 vs 120 (first version, loaded); with 1 MB chunks and
# the final two-shot: 1 MB 154 vs 110, 4 MB 569 vs 412, 32 MB 6560 vs 4582 (quieter).
DEFAULT_TWO_SHOT_MIN_BYTES = 1 << 20
# all_reduce's chunk. Two-shot at 32 MB (loaded): 64 KB chunks 36.4 ms, 256 KB 14.9, 1 MB 10.1,
# 4 MB 11.3: below 1 MB the per-chunk handshakes cost more than the cache saves, on that machine.
DEFAULT_CHUNK_BYTES = 1 << 20


@register_communicator("shm")
class ShmCommunicator(Communicator):
    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        timeout_s: float = 600.0,
        two_shot_min_bytes: int = DEFAULT_TWO_SHOT_MIN_BYTES,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        """Every rank of `group` (default: the world) constructs it together. timeout_s bounds a
        wait for a peer that is alive but never joins the collective (dead peers are found in ms)."""
        kernels = load_shm_kernels()
        if kernels is None:
            raise RuntimeError("shm communicator: its C++ module did not build (see the message above)")
        self._kernels = kernels
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        # Rank 0 makes the segment and sends its name, or why it could not.
        made, name, error = None, f"/tacit-shm-{os.getpid()}-{secrets.token_hex(6)}", ""
        args = (self.rank, self.world_size, buffer_bytes, self.rank == 0, timeout_s, two_shot_min_bytes, chunk_bytes)
        if self.rank == 0:
            try:
                made = kernels.ShmContext(name, *args)
            except Exception as e:
                error = str(e)
        box = [(name, error)]
        dist.broadcast_object_list(box, src=src, group=group)
        name, error = box[0]
        if self.rank != 0 and not error:
            try:
                made = kernels.ShmContext(name, *args)
            except Exception as e:
                error = str(e)
        # Every rank learns whether all mapped the segment on the same host before any uses it.
        states: list = [None] * self.world_size
        # The algorithm and chunking of each all-reduce follow from these: they must agree.
        settings = (buffer_bytes, two_shot_min_bytes, chunk_bytes)
        dist.all_gather_object(states, (socket.gethostname(), error, settings), group=group)
        if self.rank == 0 and made is not None:
            made.unlink()  # all have mapped it (or failed): the name is no longer needed
        hosts = {h for h, _, _ in states}
        errors = [f"rank {r}: {e}" for r, (_, e, _) in enumerate(states) if e]
        if len(hosts) > 1:
            errors.append(f"the ranks are on {len(hosts)} hosts ({', '.join(sorted(hosts))}); shm needs one")
        if len({s for _, _, s in states}) > 1:
            errors.append(
                "the ranks disagree on (buffer_bytes, two_shot_min_bytes, chunk_bytes): "
                + ", ".join(f"rank {r} {s}" for r, (_, _, s) in enumerate(states))
            )
        if errors:
            if made is not None:
                made.close()
            raise RuntimeError("shm communicator: " + "; ".join(errors))
        self._ctx = made
        self.segment_name = name  # already unlinked: /dev/shm no longer lists it
        self._lanes: dict[object, _Lane] = {}

    # -- async: each lane (the collectives; the sends to one rank; the receives from one rank)
    # runs its ops on its own thread, in issue order. send/recv have lanes of their own because a
    # message longer than its channel waits for its receiver: behind a collective, or behind this
    # rank's own receive, a ring of sends would wait forever.

    def _run(self, fn: Callable[[], torch.Tensor | None], async_op: bool, lane: object = "collectives"):
        state = self._lanes.setdefault(lane, _Lane(f"tacit-shm-{lane}"))
        return state.run(fn, async_op)

    # -- the collectives

    def _code(self, tensor: torch.Tensor, what: str) -> int:
        code = DTYPE_CODES.get(tensor.dtype)
        if code is None:
            raise ValueError(
                f"shm communicator {what}: dtype {tensor.dtype} is not summable here (float32, bfloat16, float16)"
            )
        return code

    def _check(self, tensor: torch.Tensor, what: str) -> None:
        if tensor.device.type != "cpu":
            raise ValueError(f"shm communicator {what}: the tensor is on {tensor.device}, not the CPU")
        if not tensor.is_contiguous():
            raise ValueError(f"shm communicator {what}: the tensor (shape {tuple(tensor.shape)}) is not contiguous")

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        self._check(tensor, "all_reduce")
        code = self._code(tensor, "all_reduce")

        def run() -> torch.Tensor:
            self._ctx.all_reduce(tensor.data_ptr(), tensor.numel(), code)
            return tensor

        return self._run(run, async_op)

    def all_gather(self, tensor: torch.Tensor, dim: int = 0, async_op: bool = False):
        tensor = tensor.contiguous()
        self._check(tensor, "all_gather")
        dim = dim % max(tensor.dim(), 1)

        def run() -> torch.Tensor:
            out = tensor.new_empty((self.world_size, *tensor.shape))
            self._ctx.all_gather(tensor.data_ptr(), out.data_ptr(), tensor.numel() * tensor.element_size())
            if dim == 0:
                return out.reshape(self.world_size * tensor.shape[0], *tensor.shape[1:])
            return torch.cat(out.unbind(0), dim=dim)

        return self._run(run, async_op)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0, async_op: bool = False):
        dim = dim % tensor.dim()
        if tensor.shape[dim] % self.world_size:
            raise ValueError(
                f"reduce_scatter: dim {dim} has {tensor.shape[dim]} entries, not a multiple of {self.world_size} ranks"
            )
        code = self._code(tensor, "reduce_scatter")
        moved = tensor.movedim(dim, 0).contiguous()
        self._check(moved, "reduce_scatter")

        def run() -> torch.Tensor:
            out = moved.new_empty((moved.shape[0] // self.world_size, *moved.shape[1:]))
            self._ctx.reduce_scatter(moved.data_ptr(), out.data_ptr(), out.numel(), code)
            return out if dim == 0 else out.movedim(0, dim).contiguous()

        return self._run(run, async_op)

    def all_to_all(self, tensor, output_split_sizes, input_split_sizes, async_op: bool = False):
        split_sizes_check(input_split_sizes, self.world_size, tensor.shape[0], "input_split_sizes")
        tensor = tensor.contiguous()
        self._check(tensor, "all_to_all")
        out = tensor.new_empty((sum(output_split_sizes), *tensor.shape[1:]))
        split_sizes_check(output_split_sizes, self.world_size, out.shape[0], "output_split_sizes")
        row = math.prod(tensor.shape[1:]) * tensor.element_size()
        send = [s * row for s in input_split_sizes]
        recv = [s * row for s in output_split_sizes]

        def run() -> torch.Tensor:
            self._ctx.all_to_all(tensor.data_ptr(), out.data_ptr(), send, recv)
            return out

        return self._run(run, async_op)

    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False):
        tensor = tensor.contiguous()
        self._check(tensor, "send")

        def run() -> None:
            self._ctx.send(tensor.data_ptr(), tensor.numel() * tensor.element_size(), dst)

        result = self._run(run, async_op, ("send", dst))
        return result if async_op else None

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False):
        self._check(tensor, "recv")

        def run() -> torch.Tensor:
            self._ctx.recv(tensor.data_ptr(), tensor.numel() * tensor.element_size(), src)
            return tensor

        return self._run(run, async_op, ("recv", src))

    # -- for C++ callers (a fused decode step): the all-reduce with no Python in between

    def c_all_reduce_f32(self) -> tuple[int, int]:
        return self.all_reduce_fn_ptr(), self.ctx_ptr()

    def ctx_ptr(self) -> int:
        """The address of this communicator's C++ context: tacit_shm_all_reduce's first argument."""
        return self._ctx.ctx_ptr()

    def all_reduce_fn_ptr(self) -> int:
        """The address of `int tacit_shm_all_reduce(void* ctx, void* data, int64_t numel, int dtype_code,
        char* err, int64_t err_len)` (0 on success; -1 with the reason in last_error() and in err). dtype codes: DTYPE_CODES. It must not run
        while an async collective of this communicator is in flight: they share one sequence."""
        return self._kernels.all_reduce_fn_ptr()

    def last_error(self) -> str:
        return self._ctx.last_error()

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()
        if self._ctx is not None:
            self._ctx.close()


class _Lane:
    """One thread running its ops in issue order; a synchronous op runs on the caller's thread
    when nothing is queued (no thread hop, ~20 us, for the common synchronous call)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._pending = 0
        self._lock = threading.Lock()

    def _done(self, fn: Callable[[], torch.Tensor | None]) -> torch.Tensor | None:
        try:
            return fn()
        finally:
            with self._lock:
                self._pending -= 1

    def run(self, fn: Callable[[], torch.Tensor | None], async_op: bool):
        if not async_op and not self._pending:
            return fn()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        with self._lock:
            self._pending += 1
        handle = CommHandle(self._executor.submit(self._done, fn).result)
        return handle if async_op else handle.wait()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
