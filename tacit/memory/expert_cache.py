"""MoE expert weights read from the checkpoint on demand, through a fixed in-memory cache.

Why: a MoE model's experts are most of its bytes (Qwen3-30B-A3B: 29 of 30 B parameters) but a
token uses top_k of them per layer (8 of 128), so a host that cannot hold the model can still
run it if the experts a step needs are in memory when it needs them — cann-recipes-infer's
"weights streamed from SSD". The cache is one pool of slots, each slot one expert's gate/up
and down matrices; an expert's bytes are read straight from the safetensors file into its slot
with pread (no mapping, so the page cache, not the process, holds what the OS keeps).

- acquire(layer, experts): the slots of experts a layer needs now, reading the missing ones on
  the calling thread; the layer's experts are never evicted while it runs.
- prefetch(layer, experts): the same on a background thread, for the next layer's experts as
  predicted from this layer's hidden state (the model decides what to predict).
- Eviction takes the least recently used slot, except the hot experts: the quarter of the
  slots held by the experts used most often (decayed counts) stay pinned.

The cache knows tensors and files only; models/expert_streaming.py binds it to a model.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tacit.loader.safetensors_check import read_header

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
PROJS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TensorLocation:
    path: Path
    offset: int  # absolute byte offset in the file
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def safetensors_locations(files: list[Path]) -> dict[str, TensorLocation]:
    """Every tensor's place in the shards, from their headers (checked by read_header)."""
    out = {}
    for f in files:
        header, data_bytes = read_header(f)
        start = f.stat().st_size - data_bytes
        for name, info in header.items():
            if name == "__metadata__" or info["dtype"] not in _DTYPES:
                continue
            begin, end = info["data_offsets"]
            out[name] = TensorLocation(f, start + begin, end - begin, _DTYPES[info["dtype"]], tuple(info["shape"]))
    return out


@dataclass
class ExpertCacheStats:
    acquired: int = 0  # experts asked for by acquire
    hits: int = 0  # ... already in memory (or being read by a prefetch)
    predictable: int = 0  # experts asked for by a layer that had a prefetch prediction
    prefetch_hits: int = 0  # ... that the prediction named
    prefetched: int = 0  # experts a prefetch read
    bytes_read: int = 0
    tokens: int = 0  # tokens the layers ran (per step: the step's tokens, counted once)

    def as_dict(self) -> dict[str, float]:
        return {
            "expert_cache_hit_rate": self.hits / self.acquired if self.acquired else 0.0,
            "expert_prefetch_hit_rate": self.prefetch_hits / self.predictable if self.predictable else 0.0,
            "expert_bytes_read_per_token": self.bytes_read / self.tokens if self.tokens else 0.0,
        }


@dataclass
class _Slot:
    key: tuple[int, int] | None = None  # (layer, expert)
    ready: Future | None = None  # set while its read runs


@dataclass
class ExpertCache:
    """`locations[(layer, expert)]` = (gate, up, down) TensorLocations of [I, H], [I, H], [H, I]."""

    locations: dict[tuple[int, int], tuple[TensorLocation, TensorLocation, TensorLocation]]
    num_slots: int
    hidden_size: int
    intermediate_size: int
    dtype: torch.dtype
    stats: ExpertCacheStats = field(default_factory=ExpertCacheStats)

    def __post_init__(self) -> None:
        s, i, h = self.num_slots, self.intermediate_size, self.hidden_size
        self.w13 = torch.empty(s, 2 * i, h, dtype=self.dtype)
        self.w2 = torch.empty(s, h, i, dtype=self.dtype)
        self._slots = [_Slot() for _ in range(s)]
        self._where: dict[tuple[int, int], int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict((k, None) for k in range(s))  # oldest first
        self._uses: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tacit-expert-prefetch")
        self._files: dict[Path, int] = {}
        self._protected: set[int] = set()  # the slots of the layer running now
        self._predicted: dict[int, set[int]] = {}  # layer -> experts its prefetch named

    @staticmethod
    def expert_bytes(hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> int:
        return 3 * hidden_size * intermediate_size * dtype.itemsize

    def close(self) -> None:
        self._reader.shutdown(wait=True)
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    # ---- reads ----
    def _fd(self, path: Path) -> int:
        fd = self._files.get(path)
        if fd is None:
            fd = self._files[path] = os.open(path, os.O_RDONLY)
        return fd

    def _read_into(self, loc: TensorLocation, dst: torch.Tensor) -> None:
        if loc.dtype == dst.dtype:
            buf = memoryview(dst.view(torch.uint8).numpy()).cast("B")
        else:  # a checkpoint in another float type: read, then convert as the resident load does
            tmp = torch.empty(loc.shape, dtype=loc.dtype)
            buf = memoryview(tmp.view(torch.uint8).numpy()).cast("B")
        got = os.preadv(self._fd(loc.path), [buf], loc.offset)
        if got != loc.nbytes:
            raise OSError(f"{loc.path}: read {got} of {loc.nbytes} bytes at offset {loc.offset}")
        if loc.dtype != dst.dtype:
            dst.copy_(tmp)

    def _load(self, slot: int, key: tuple[int, int]) -> None:
        gate, up, down = self.locations[key]
        i = self.intermediate_size
        self._read_into(gate, self.w13[slot, :i])
        self._read_into(up, self.w13[slot, i:])
        self._read_into(down, self.w2[slot])
        with self._lock:  # prefetches count from the reader thread
            self.stats.bytes_read += gate.nbytes + up.nbytes + down.nbytes

    # ---- slots ----
    def _victim(self, protected: set[int], keep_hot: bool = True) -> int | None:
        """The least recently used slot that is not protected, not being read, and (keep_hot)
        not hot."""
        pinned = self.num_slots // 4 if keep_hot else 0
        hot = set()
        if pinned and len(self._uses) > pinned:
            ranked = sorted(self._uses.items(), key=lambda kv: kv[1], reverse=True)[:pinned]
            hot = {self._where[k] for k, _ in ranked if k in self._where}
        for slot in self._lru:
            if slot in protected or slot in hot:
                continue
            s = self._slots[slot]
            if s.ready is not None and not s.ready.done():
                continue
            return slot
        return None

    def _claim(self, key: tuple[int, int], protected: set[int], keep_hot: bool = True) -> tuple[int, Future] | None:
        """Under the lock: a slot for key whose read the caller runs, or None if none is free."""
        slot = self._victim(protected, keep_hot)
        if slot is None:
            return None
        old = self._slots[slot]
        if old.key is not None:
            self._where.pop(old.key, None)
        fut: Future = Future()
        self._slots[slot] = _Slot(key, fut)
        self._where[key] = slot
        self._lru.move_to_end(slot)
        return slot, fut

    def _fill(self, slot: int, key: tuple[int, int], fut: Future) -> None:
        try:
            self._load(slot, key)
            fut.set_result(None)
        except BaseException as e:  # the waiter re-raises it; the slot is freed for another expert
            with self._lock:
                if self._where.get(key) == slot:
                    del self._where[key]
                self._slots[slot] = _Slot()
            fut.set_exception(e)

    def _claim_for_layer(
        self, key: tuple[int, int], protected: set[int], layer: int, wanted: int
    ) -> tuple[int, Future]:
        """Under the lock: a slot for a running layer's expert. The cache holds the largest step's
        experts (checked at load), so a slot is free once prefetch reads in flight finish (the
        lock is let go while waiting: the reader takes it) and the hot pin yields if it must;
        under load a slow prefetch once made this fail ("5 slots cannot hold 3 experts")."""
        claimed = self._claim(key, protected)
        while claimed is None:
            reading = [
                s.ready for i, s in enumerate(self._slots) if i not in protected and s.ready and not s.ready.done()
            ]
            if not reading:
                break
            self._lock.release()
            try:
                wait(reading, return_when=FIRST_COMPLETED)
            finally:
                self._lock.acquire()
            claimed = self._claim(key, protected)
        if claimed is None:
            claimed = self._claim(key, protected, keep_hot=False)
        if claimed is None:
            raise RuntimeError(
                f"expert cache: {self.num_slots} slots cannot hold layer {layer}'s {wanted} "
                f"active experts; raise --expert-cache-memory"
            )
        return claimed

    def acquire(self, layer: int, experts: list[int], num_tokens: int) -> torch.Tensor:
        """int64 [max expert + 1]: the slot of each of `experts` (-1 for the others), every one
        read and protected from eviction until the next acquire."""
        if not experts:
            return torch.empty(0, dtype=torch.int64)
        waits, todo, slots = [], [], {}
        with self._lock:
            protected = {self._where[(layer, e)] for e in experts if (layer, e) in self._where}
            for e in experts:
                key = (layer, e)
                self._uses[key] = self._uses.get(key, 0.0) + 1.0
                self.stats.acquired += 1
                slot = self._where.get(key)
                if slot is not None:
                    s = self._slots[slot]
                    self.stats.hits += 1
                    if s.ready is not None:
                        waits.append(s.ready)
                    self._lru.move_to_end(slot)
                else:
                    slot, fut = self._claim_for_layer(key, protected, layer, len(experts))
                    todo.append((slot, key, fut))
                    waits.append(fut)
                slots[e] = slot
                protected.add(slot)
            predicted = self._predicted.pop(layer, None)
            if predicted is not None:
                self.stats.predictable += len(experts)
                self.stats.prefetch_hits += len(predicted.intersection(experts))
            if layer == 0:
                self.stats.tokens += num_tokens
                for k in self._uses:  # decay once a step, so "hot" follows the recent text
                    self._uses[k] *= 0.9
        for slot, key, fut in todo:
            self._fill(slot, key, fut)
        for w in waits:
            w.result()
        table = torch.full((max(experts) + 1,), -1, dtype=torch.int64)
        for e, s in slots.items():
            table[e] = s
        self._protected = set(slots.values())
        return table

    def prefetch(self, layer: int, experts: list[int]) -> None:
        """Start reading the missing ones of `experts` on the background thread; never evicts the
        experts the current layer holds, and gives up on those it finds no slot for."""
        with self._lock:
            self._predicted[layer] = set(experts)
            protected = set(self._protected)
            protected |= {self._where[(layer, e)] for e in experts if (layer, e) in self._where}
            jobs = []
            for e in experts:
                key = (layer, e)
                if key in self._where:
                    continue
                claimed = self._claim(key, protected)
                if claimed is None:
                    break
                slot, fut = claimed
                protected.add(slot)
                jobs.append((slot, key, fut))
                self.stats.prefetched += 1
        for slot, key, fut in jobs:
            self._reader.submit(self._fill, slot, key, fut)
