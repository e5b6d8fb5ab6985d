"""A model runner's side of swapping (memory/swap.py has the scheduler's side and the why): its
KV layers' blocks copied to host memory and back as the step's SwapOps say, before the forward.
Next to the runner, not in memory/: it copies tensors of layers, which the scheduler's
bookkeeping below the layers must not import."""

from __future__ import annotations

import time

import torch

from tacit.layers.kv_cache import KVCacheLayer
from tacit.memory.swap import SwapOp


class KVSwapStore:
    """A runner's side of swapping: its KV layers' blocks in host memory, by request."""

    def __init__(self, layers: list[KVCacheLayer]) -> None:
        odd = [type(m).__name__ for m in layers if not isinstance(m, KVCacheLayer)]
        if odd:
            raise TypeError(f"KVSwapStore swaps KVCacheLayer caches; {', '.join(odd)} does not declare the interface")
        self.layers = layers
        self.dims = [m.kv_block_dim for m in layers]
        self._stored: dict[str, list[torch.Tensor]] = {}

    def _copy_out(self, blocks: tuple[int, ...] | list[int]) -> list[torch.Tensor]:
        out = []
        for m, d in zip(self.layers, self.dims):
            idx = torch.tensor(blocks, device=m.kv_cache.device)
            out.append(m.kv_cache.index_select(d, idx).to("cpu"))
        return out

    def probe(self, num_blocks: int) -> float:
        """Seconds for one copy of num_blocks out (not kept): the bandwidth the first cost
        comparison uses."""
        t0 = time.perf_counter()
        self._copy_out(list(range(num_blocks)))
        return time.perf_counter() - t0

    def apply(self, ops: list[SwapOp]) -> tuple[int, float]:
        """Carry the ops out in order -> (blocks copied, seconds)."""
        copied, t0 = 0, time.perf_counter()
        for op in ops:
            if op.kind == "out":
                self._stored[op.request_id] = self._copy_out(op.block_ids)
                copied += len(op.block_ids)
            elif op.kind == "in":
                saved = self._stored.pop(op.request_id)
                for m, d, host in zip(self.layers, self.dims, saved):
                    idx = torch.tensor(op.block_ids, device=m.kv_cache.device)
                    m.kv_cache.index_copy_(d, idx, host.to(m.kv_cache.device))
                copied += len(op.block_ids)
            elif op.kind == "drop":
                self._stored.pop(op.request_id, None)
            else:
                raise ValueError(f"unknown swap op {op.kind!r}; valid: out, in, drop")
        return copied, time.perf_counter() - t0
