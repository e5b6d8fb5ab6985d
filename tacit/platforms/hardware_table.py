"""The hardware table: datasheet figures per part, each with its source (see specs.py); the
entries live in one file per family (hw_gpus.py, hw_ascend.py, hw_cpus.py).

Conventions, so entries compare: FLOP/s are dense (half a datasheet's "with sparsity" figure);
memory capacity in bytes as the vendor counts it; link bandwidth is what ONE device sends in
ONE direction (NVIDIA quotes NVLink both ways added: 900 GB/s on H100 is 450 GB/s each way);
link latency is the per-step cost of a small collective, which no datasheet gives: those are
estimates and say so.
"""

from __future__ import annotations

import functools

from tacit.platforms.compute_thread import run_on_own_thread
from tacit.platforms.hw_ascend import ASCEND
from tacit.platforms.hw_cpus import CPUS
from tacit.platforms.hw_gpus import GPUS
from tacit.platforms.hw_probe import matmul_flops, peak_read_bandwidth
from tacit.platforms.specs import HardwareSpec, Sourced, check_spec

# One table over the families' files (hw_gpus, hw_ascend, hw_cpus); a name is in one of them.
TABLE: dict[str, HardwareSpec] = {**GPUS, **ASCEND, **CPUS}


def hardware_names() -> list[str]:
    return [*TABLE, "this-cpu"]


def get_hardware_spec(name: str) -> HardwareSpec:
    """The spec of `name` (see hardware_names()); `this-cpu` is measured once per process."""
    if name == "this-cpu":
        return this_cpu_spec()
    if name not in TABLE:
        raise ValueError(f"hardware {name!r} is not known; valid: {', '.join(hardware_names())}")
    return check_spec(TABLE[name])


def this_cpu_peaks() -> dict[str, float]:
    """This machine's roofs now, measured by `bench hw`'s probes (a few seconds, every call):
    fp32 and "bf16" FLOP/s (the latter the faster of bfloat16 and float32 matmuls: the dtype tacit
    computes in where bf16 has no oneDNN path) and read bandwidth.

    Measured on a thread of their own (compute_thread.py): a probe run on the caller's thread
    would leave it an OpenMP pool that slows every engine thread started after it."""
    import torch

    def probe() -> dict[str, float]:
        fp32 = matmul_flops(torch.float32, n=1024)
        bf16 = max(matmul_flops(torch.bfloat16, n=1024), fp32)
        return {"fp32_flops": fp32, "bf16_flops": bf16, "read_bandwidth": peak_read_bandwidth()}

    return run_on_own_thread(probe, name="tacit-hw-probe")


@functools.lru_cache(maxsize=1)
def this_cpu_spec() -> HardwareSpec:
    """This machine as first measured in this process (measure_this_cpu_spec, once)."""
    return measure_this_cpu_spec()


def measure_this_cpu_spec() -> HardwareSpec:
    """This machine now, measured by tacit's `bench hw` functions (this_cpu_peaks).

    The link figures are the shared-memory communicator's, measured by `tacit bench comm`
    (docs/benchmarks.md, issue 14): 4.8 us for a 4 KB all-reduce on 2 ranks, and 32 MB in
    5.47 ms, i.e. ~6 GB/s once the copies through the segment dominate."""
    import os

    import torch

    threads = torch.get_num_threads()
    measured = f"measured in this process by tacit.platforms.hw_probe ({threads} threads)"
    peaks = this_cpu_peaks()
    fp32, bf16 = peaks["fp32_flops"], peaks["bf16_flops"]
    try:
        mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem_total = 0
    return check_spec(
        HardwareSpec(
            name="this-cpu",
            description=f"this machine's CPU, {threads} threads",
            flops={
                "bf16": Sourced(bf16, measured + ": the faster of matmul_flops(bfloat16) and (float32)"),
                # tacit's int8 (Q8_0) kernels unpack to fp32 and multiply there: no int8 unit is used.
                "int8": Sourced(bf16, measured + ": bf16 matmul stands in (Q8_0 kernels compute in fp32)"),
                "fp32": Sourced(fp32, measured + ": matmul_flops(float32)"),
            },
            memory_bandwidth=Sourced(peaks["read_bandwidth"], measured + ": peak_read_bandwidth()"),
            memory_capacity=Sourced(float(mem_total or 1), "sysconf(SC_PHYS_PAGES) * page size"),
            link_bandwidth=Sourced(6.0e9, "docs/benchmarks.md, tacit bench comm (shm, 2 ranks): 32 MB in 5.47 ms"),
            link_latency=Sourced(4.8e-6, "docs/benchmarks.md, tacit bench comm (shm, 2 ranks): 4 KB in 4.8 us"),
            efficiency_profile="this-cpu",
            # one process, no peers: the link figures above price tacit's own 2-rank shm runs
            devices_per_node=1,
            graphs=False,
        )
    )
