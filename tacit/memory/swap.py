"""Swap: a preempted request's KV blocks copied to host memory and back.

Recompute throws a request's KV away and prefills it again on resume; swap keeps a copy in
host memory and copies it back into whatever blocks are free then. Which is cheaper depends on
the model and the machine, so the scheduler compares the two with measured numbers:

    swap      = 2 x bytes of its blocks / measured copy bandwidth   (out now, in on resume)
    recompute = its computed tokens x measured prefill seconds per token

For the default model on this CPU swap wins ~15x: 23 KB of bf16 KV a token, copied block by
block over 30 layers at the 1.3-2.1 GB/s measured (small copies, far below the 25 GB/s a big
memcpy gets), is ~30 us a token out and back, against ~0.45 ms a token to prefill it again.

Two halves, as vLLM splits them, so that data flows one way through a step:
  SwapSpace (the scheduler's): the host space in blocks, who holds a copy, the copy bandwidth.
      It decides; each decision is a SwapOp, plain data that travels in the SchedulerOutput.
  KVSwapStore (each model runner's, worker/swap_store.py): carries the SwapOps out on its own KV layers before the
      step's forward. Under tensor parallelism every rank swaps its own shard of the cache (the
      copies once ran inside the scheduler, on rank 0's shard alone, and a swapped request
      resumed over the other ranks' overwritten blocks).

Every KVCacheLayer has its `kv_cache` swapped, whatever its shape ([2, num_blocks, block_size,
Hkv, D] for Attention, [num_blocks, block_size, C] for DeepSeek's MLA), along the block axis
the layer declares (kv_block_dim).
"""

from __future__ import annotations

from dataclasses import dataclass

# A new copy counts 1/4 in the running bandwidth: a few swaps follow a change of load on the
# shared cores, and one slow copy (page faults on fresh host memory) does not swing the choice.
_BW_WEIGHT = 0.25


@dataclass(frozen=True)
class SwapOp:
    """One copy for every runner to make before the step's forward, in order.
    out: save these blocks of the request; in: restore its saved blocks into the first of these
    (newly allocated) blocks; drop: forget its saved copy (aborted or finished while out)."""

    kind: str  # "out" | "in" | "drop"
    request_id: str
    block_ids: tuple[int, ...] = ()


class SwapSpace:
    """The scheduler's side of swapping: no tensors, only accounting and the decisions' ops."""

    def __init__(self, capacity_blocks: int, bytes_per_block: int, bytes_per_s: float) -> None:
        self.capacity_blocks = capacity_blocks
        self.bytes_per_block = bytes_per_block
        self.bytes_per_s = bytes_per_s  # measured: KVSwapStore.probe at start, then every copy
        self.used_blocks = 0
        self.num_swapped_out = 0
        self.num_swapped_in = 0
        self._held: dict[str, int] = {}  # request id -> blocks saved
        self._ops: list[SwapOp] = []

    def cost_s(self, num_blocks: int) -> float:
        """Seconds to swap num_blocks out and back in, at the measured bandwidth."""
        return 2 * num_blocks * self.bytes_per_block / self.bytes_per_s

    def has_room(self, num_blocks: int) -> bool:
        return self.used_blocks + num_blocks <= self.capacity_blocks

    def holds(self, request_id: str) -> bool:
        return request_id in self._held

    def swap_out(self, request_id: str, blocks: list[int]) -> None:
        """Before the blocks are freed: the step's runners copy them out before its forward
        writes into any of them."""
        self._held[request_id] = len(blocks)
        self._ops.append(SwapOp("out", request_id, tuple(blocks)))
        self.used_blocks += len(blocks)
        self.num_swapped_out += 1

    def swap_in(self, request_id: str, blocks: list[int]) -> None:
        """Its saved KV goes into `blocks` (newly allocated; at least as many as were saved)."""
        n = self._held.pop(request_id)
        self._ops.append(SwapOp("in", request_id, tuple(blocks[:n])))
        self.used_blocks -= n
        self.num_swapped_in += 1

    def drop(self, request_id: str) -> None:
        n = self._held.pop(request_id, None)
        if n is not None:
            self._ops.append(SwapOp("drop", request_id))
            self.used_blocks -= n

    def take_ops(self) -> list[SwapOp]:
        """The ops decided since the last call, for the next SchedulerOutput."""
        ops, self._ops = self._ops, []
        return ops

    def observe(self, num_blocks: int, seconds: float) -> None:
        """A runner's copy of num_blocks took `seconds` (ModelRunnerOutput.swap_blocks/swap_s)."""
        if num_blocks and seconds > 0:
            bw = num_blocks * self.bytes_per_block / seconds
            self.bytes_per_s = (1 - _BW_WEIGHT) * self.bytes_per_s + _BW_WEIGHT * bw
