"""The reference Communicator: torch.distributed on a process group (gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tacit.distributed.communicator import CommHandle, Communicator, register_communicator, split_sizes_check


def _handle(work: dist.Work | None, result: torch.Tensor | None) -> CommHandle:
    def wait() -> torch.Tensor | None:
        if work is not None:
            work.wait()
        return result

    return CommHandle(wait)


@register_communicator("torch")
class TorchCommunicator(Communicator):
    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._global_ranks = dist.get_process_group_ranks(group) if group is not None else None

    @classmethod
    def create(cls, backend: str | None) -> TorchCommunicator:
        # On an accelerator a group of its own backend (NCCL) beside the gloo world group that
        # carries the engine's control messages (block counts, per-rank stats) as CPU tensors.
        return cls(dist.new_group(backend=backend) if backend is not None else None)

    def _global(self, rank: int) -> int:
        return rank if self._global_ranks is None else self._global_ranks[rank]

    def _finish(self, work: dist.Work | None, result: torch.Tensor | None, async_op: bool):
        handle = _handle(work, result)
        return handle if async_op else handle.wait()

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        work = dist.all_reduce(tensor, group=self.group, async_op=async_op)
        return self._finish(work, tensor, async_op)

    def all_gather(self, tensor: torch.Tensor, dim: int = 0, async_op: bool = False):
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        work = dist.all_gather(parts, tensor, group=self.group, async_op=async_op)
        handle = _handle(work, None)
        gathered = CommHandle(lambda: (handle.wait(), torch.cat(parts, dim=dim))[1])
        return gathered if async_op else gathered.wait()

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0, async_op: bool = False):
        if tensor.shape[dim] % self.world_size:
            raise ValueError(
                f"reduce_scatter: dim {dim} has {tensor.shape[dim]} entries, not a multiple of {self.world_size} ranks"
            )
        # gloo has no reduce_scatter: an all-reduce and this rank's slice give the same sum.
        reduced = tensor.clone()
        work = dist.all_reduce(reduced, group=self.group, async_op=async_op)
        part = tensor.shape[dim] // self.world_size
        handle = _handle(work, None)
        sliced = CommHandle(lambda: (handle.wait(), reduced.narrow(dim, self.rank * part, part).contiguous())[1])
        return sliced if async_op else sliced.wait()

    def all_to_all(self, tensor, output_split_sizes, input_split_sizes, async_op: bool = False):
        split_sizes_check(input_split_sizes, self.world_size, tensor.shape[0], "input_split_sizes")
        out = tensor.new_empty((sum(output_split_sizes), *tensor.shape[1:]))
        split_sizes_check(output_split_sizes, self.world_size, out.shape[0], "output_split_sizes")
        if dist.get_backend(self.group) == "gloo":
            # gloo has no all_to_all: one send and one receive per peer, all in flight together.
            ins = list(tensor.contiguous().split(input_split_sizes))
            outs = list(out.split(output_split_sizes))
            outs[self.rank].copy_(ins[self.rank])
            ops = []
            for peer in range(self.world_size):
                if peer != self.rank:
                    ops.append(dist.P2POp(dist.isend, ins[peer].contiguous(), self._global(peer), self.group))
                    ops.append(dist.P2POp(dist.irecv, outs[peer], self._global(peer), self.group))
            works = dist.batch_isend_irecv(ops) if ops else []
            handle = CommHandle(lambda: ([w.wait() for w in works], out)[1])
            return handle if async_op else handle.wait()
        work = dist.all_to_all_single(
            out, tensor.contiguous(), output_split_sizes, input_split_sizes, group=self.group, async_op=async_op
        )
        return self._finish(work, out, async_op)

    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False):
        if async_op:
            return _handle(dist.isend(tensor.contiguous(), self._global(dst), group=self.group), None)
        dist.send(tensor.contiguous(), self._global(dst), group=self.group)
        return None

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False):
        if async_op:
            return _handle(dist.irecv(tensor, self._global(src), group=self.group), tensor)
        dist.recv(tensor, self._global(src), group=self.group)
        return tensor
