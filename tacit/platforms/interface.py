"""Platform: what the engine needs to know about a device kind, behind one small seam.

An Ascend NPU (torch_npu) would add one more subclass; nothing above this file changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Platform(ABC):
    name: str
    device_type: str
    dist_backend: str

    @abstractmethod
    def is_available(self) -> bool: ...

    @abstractmethod
    def free_memory_bytes(self) -> int: ...

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type, index) if self.device_type != "cpu" else torch.device("cpu")

    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16
