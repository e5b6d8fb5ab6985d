from __future__ import annotations

import os

import torch

from tacit.platforms.interface import Platform

# oneDNN caches one primitive per matmul shape, and a prefill step's shape is its token count:
# every new step size adds a few (one per projection shape), up to oneDNN's default of 1024
# entries. RSS over a server soak rose with a falling slope (57, then 14, 12, 5 MB/min), the
# profile of this cache filling. 64 entries hold the shapes of the last several steps; a miss
# costs well under 1 ms against a prefill step of tens of ms. Measured on one 1536x576 bf16
# projection, 800 new token counts after 300 (tests/platforms/test_platforms.py repeats it):
# RSS +420 MB at 1024 entries, +150 MB at 64. What remains still grows with the number of
# distinct step sizes, at most max_num_batched_tokens of them. oneDNN reads the setting at its
# first matmul, so it is set as the platform is chosen, before the model is built; a value
# the user set wins.
ONEDNN_PRIMITIVE_CACHE_CAPACITY = 64


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    # Shared memory for CPU ranks on one host: a 16 KB all-reduce in ~7 us against gloo's ~1 ms
    # here (`tacit bench comm`).
    default_communicator = "shm"

    def __init__(self) -> None:
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVE_CACHE_CAPACITY))

    def is_available(self) -> bool:
        return True

    def bind_local_rank(self, local_rank: int, local_world: int) -> None:
        """CPU ranks share the one device and split its cores instead (worker/rank.py pin_to_cores)."""

    def default_dtype(self) -> torch.dtype:
        """bf16 where oneDNN has a bf16 matmul (AVX-512 and newer; AMX makes it the fast one),
        float32 elsewhere: on an AVX2-only EPYC torch's bf16 fallback ran a 1024^3 matmul at
        0.9 GFLOP/s against float32's 62 (67x slower), so bf16 there costs far more than it saves."""
        return torch.bfloat16 if bf16_matmul_is_native() else torch.float32

    def free_memory_bytes(self) -> int:
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def bf16_matmul_is_native() -> bool:
    """Whether this CPU runs bf16 matmuls through oneDNN (not torch's scalar fallback); a torch
    built without oneDNN answers no."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
