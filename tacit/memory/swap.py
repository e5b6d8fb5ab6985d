"""KVSwapper: a preempted request's KV blocks copied to host memory and back.

Recompute throws a request's KV away and prefills it again on resume; swap keeps a copy in
host memory and copies it back into whatever blocks are free then. Which is cheaper depends on
the model and the machine, so the scheduler compares the two with measured numbers:

    swap      = 2 x bytes of its blocks / measured copy bandwidth   (out now, in on resume)
    recompute = its computed tokens x measured prefill seconds per token

For the default model on this CPU swap wins ~15x: 23 KB of bf16 KV a token, copied block by
block over 30 layers at the 1.3-2.1 GB/s measured (small copies, far below the 25 GB/s a big
memcpy gets), is ~30 us a token out and back, against ~0.45 ms a token to prefill it again.

Every KVCacheLayer has its `kv_cache` swapped, whatever its shape ([2, num_blocks, block_size,
Hkv, D] for Attention, [num_blocks, block_size, C] for DeepSeek's MLA), along the block axis
the layer declares (kv_block_dim).
"""

from __future__ import annotations

import time

import torch

from tacit.layers.kv_cache import KVCacheLayer

# A new copy counts 1/4 in the running bandwidth: a few swaps follow a change of load on the
# shared cores, and one slow copy (page faults on fresh host memory) does not swing the choice.
_BW_WEIGHT = 0.25


class KVSwapper:
    def __init__(
        self, layers: list[KVCacheLayer], num_blocks: int, block_size: int, bytes_per_block: int, swap_space_bytes: int
    ) -> None:
        odd = [type(m).__name__ for m in layers if not isinstance(m, KVCacheLayer)]
        if odd:
            raise TypeError(f"KVSwapper swaps KVCacheLayer caches; {', '.join(odd)} does not declare the interface")
        self.layers = layers
        self.dims = [m.kv_block_dim for m in layers]
        self.bytes_per_block = bytes_per_block
        self.capacity_blocks = swap_space_bytes // bytes_per_block
        self.used_blocks = 0
        self._stored: dict[str, list[torch.Tensor]] = {}
        self.num_swapped_out = 0
        self.num_swapped_in = 0
        self.bytes_per_s = 0.0
        self._probe(min(num_blocks, 4))

    def _probe(self, n: int) -> None:
        """One timed copy of n blocks, so the first cost comparison uses a measured bandwidth."""
        self._copy_out(list(range(n)))

    def _copy_out(self, blocks: list[int]) -> list[torch.Tensor]:
        t0 = time.perf_counter()
        out = []
        for m, d in zip(self.layers, self.dims):
            idx = torch.tensor(blocks, device=m.kv_cache.device)
            out.append(m.kv_cache.index_select(d, idx).to("cpu"))
        self._measured(len(blocks), time.perf_counter() - t0)
        return out

    def _measured(self, num_blocks: int, seconds: float) -> None:
        bw = num_blocks * self.bytes_per_block / max(seconds, 1e-9)
        self.bytes_per_s = bw if not self.bytes_per_s else (1 - _BW_WEIGHT) * self.bytes_per_s + _BW_WEIGHT * bw

    def cost_s(self, num_blocks: int) -> float:
        """Seconds to swap num_blocks out and back in, at the measured bandwidth."""
        return 2 * num_blocks * self.bytes_per_block / self.bytes_per_s

    def has_room(self, num_blocks: int) -> bool:
        return self.used_blocks + num_blocks <= self.capacity_blocks

    def holds(self, request_id: str) -> bool:
        return request_id in self._stored

    def swap_out(self, request_id: str, blocks: list[int]) -> None:
        self._stored[request_id] = self._copy_out(blocks)
        self.used_blocks += len(blocks)
        self.num_swapped_out += 1

    def swap_in(self, request_id: str, blocks: list[int]) -> None:
        """Copy its saved KV into `blocks` (newly allocated; at least as many as were saved)."""
        saved = self._stored.pop(request_id)
        n = saved[0].shape[self.dims[0]] if saved else 0
        t0 = time.perf_counter()
        for m, d, host in zip(self.layers, self.dims, saved):
            idx = torch.tensor(blocks[:n], device=m.kv_cache.device)
            m.kv_cache.index_copy_(d, idx, host.to(m.kv_cache.device))
        self._measured(n, time.perf_counter() - t0)
        self.used_blocks -= n
        self.num_swapped_in += 1

    def drop(self, request_id: str) -> None:
        saved = self._stored.pop(request_id, None)
        if saved:
            self.used_blocks -= saved[0].shape[self.dims[0]]
