"""Platform: what the engine needs to know about a device kind, behind one small seam.

An Ascend NPU (torch_npu) would add one more subclass; nothing above this file changes.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod

import torch


class Platform(ABC):
    name: str
    device_type: str
    dist_backend: str
    # The tensor-parallel communicator `communicator="auto"` picks (distributed/communicator.py's
    # registry), and the backend its data path needs beyond the gloo world group (None: none).
    default_communicator: str = "torch"
    communicator_backend: str | None = None
    index: int = 0  # which device of this kind ("cuda:1"); set by get_platform

    def device_count(self) -> int:
        """How many devices of this kind there are (indices 0 .. count - 1)."""
        return 1

    @abstractmethod
    def is_available(self) -> bool: ...

    @abstractmethod
    def free_memory_bytes(self) -> int: ...

    def set_index(self, index: int, asked: str) -> None:
        """Use device `index` of this kind; asked: the device string, for the error."""
        count = self.device_count()
        if index >= count:
            raise ValueError(
                f"device={asked!r}: this machine has {count} {self.name} device(s); valid indices: 0-{count - 1}"
            )
        self.index = index

    def bind_local_rank(self, local_rank: int, local_world: int) -> None:
        """Make this process one of `local_world` ranks on this host, each on its own device,
        counted from the one asked for ("cuda:2" with 2 ranks: cuda:2 and cuda:3). Refused,
        naming both numbers, when the host has too few; the driver calls it before it spawns."""
        count, first = self.device_count(), self.index
        if first + local_world > count:
            raise ValueError(
                f"{local_world} ranks on this host need {local_world} {self.name} devices from index {first}; "
                f"this machine has {count} (indices 0-{count - 1})"
            )
        self.index = first + local_rank
        self.select()

    def select(self) -> None:
        """Make self.index this process's current device (where the platform has such a notion)."""

    def device(self, index: int | None = None) -> torch.device:
        index = self.index if index is None else index
        return torch.device(self.device_type, index) if self.device_type != "cpu" else torch.device("cpu")

    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def release_host_memory(self) -> None:
        """Give the host heap's free pages back to the system (glibc's malloc_trim; a no-op
        elsewhere). Steps of ever new shapes leave freed holes that glibc keeps: 1,100 distinct
        bf16 matmul shapes left 700 MB resident, 540 MB after a trim. The server calls it when
        it goes idle, where the few ms it takes cost nobody anything."""
        trim = _malloc_trim()
        if trim is not None:
            trim(0)


_TRIM: list = []


def _malloc_trim():
    """glibc's malloc_trim, looked up once; None where the C library has none (musl, macOS)."""
    if not _TRIM:
        _TRIM.append(getattr(ctypes.CDLL(None), "malloc_trim", None))  # the process's own symbols
    return _TRIM[0]
