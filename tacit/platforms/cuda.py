from __future__ import annotations

import torch

from tacit.platforms.interface import Platform


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    communicator_backend = "nccl"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def select(self) -> None:
        # NCCL builds each rank's communicator on the current device, not the tensors' own.
        torch.cuda.set_device(self.index)

    def free_memory_bytes(self) -> int:
        free, _total = torch.cuda.mem_get_info(self.index)
        return int(free)
