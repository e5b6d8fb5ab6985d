"""HardwareSpec: the ceilings a performance model divides by, each figure with its source.

A prediction is only as good as the roofs under it, so every field is a `Sourced` value: the
number and where it comes from (a datasheet, a measurement, or an estimate said to be one).
The table itself is `hardware_table.py`; `this-cpu` is measured in this process, once.
FLOP/s are DENSE: a datasheet's "with sparsity" figure is twice what a dense GEMM can reach.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sourced:
    """A number and where it comes from; an empty source is refused by `check_spec`."""

    value: float
    source: str


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    description: str
    # dtype ("bf16", "fp16", "fp8", "int8") -> dense FLOP/s (int8: dense OP/s)
    flops: dict[str, Sourced]
    memory_bandwidth: Sourced  # bytes/s the device's own memory streams
    memory_capacity: Sourced  # bytes of device memory
    link_bandwidth: Sourced  # bytes/s one device sends (one direction) to its peers
    link_latency: Sourced  # seconds per step of a collective
    # The efficiency profile in tacit/perf_model/data/efficiency.json this part uses.
    efficiency_profile: str = "accelerator"
    extra: dict[str, Sourced] = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s of a GEMM in `dtype`; a part without that unit computes in its 16-bit one
        (fp8 weights on an A100, which has no fp8 tensor cores, are multiplied in bf16)."""
        if dtype in self.flops:
            return self.flops[dtype].value
        return self.flops["bf16"].value

    def sourced_fields(self) -> dict[str, Sourced]:
        out = {f"flops[{k}]": v for k, v in self.flops.items()}
        out.update(
            memory_bandwidth=self.memory_bandwidth,
            memory_capacity=self.memory_capacity,
            link_bandwidth=self.link_bandwidth,
            link_latency=self.link_latency,
        )
        out.update({f"extra[{k}]": v for k, v in self.extra.items()})
        return out


def check_spec(spec: HardwareSpec) -> HardwareSpec:
    """Refuse an entry with a field that does not say where its number comes from, or a
    non-positive number (a zero bandwidth would divide by zero far from here)."""
    if "bf16" not in spec.flops:
        raise ValueError(f"hardware {spec.name!r}: flops has no 'bf16' entry (has {sorted(spec.flops)})")
    for key, v in spec.sourced_fields().items():
        if not isinstance(v, Sourced) or not str(v.source).strip():
            raise ValueError(f"hardware {spec.name!r}: field {key} has no source")
        if not v.value > 0:
            raise ValueError(f"hardware {spec.name!r}: field {key} must be > 0, got {v.value!r}")
    return spec


def hardware_names() -> list[str]:
    from tacit.platforms.hardware_table import TABLE

    return [*TABLE, "this-cpu"]


def get_hardware_spec(name: str) -> HardwareSpec:
    """The spec of `name` (see hardware_names()); `this-cpu` is measured once per process."""
    from tacit.platforms.hardware_table import TABLE

    if name == "this-cpu":
        return this_cpu_spec()
    if name not in TABLE:
        raise ValueError(f"hardware {name!r} is not known; valid: {', '.join(hardware_names())}")
    return check_spec(TABLE[name])


@functools.lru_cache(maxsize=1)
def this_cpu_spec() -> HardwareSpec:
    """This machine, measured by tacit's `bench hw` functions (a few seconds, once per process).

    The link figures are the shared-memory communicator's, measured by `tacit bench comm`
    (docs/benchmarks.md, issue 14): 4.8 us for a 4 KB all-reduce on 2 ranks, and 32 MB in
    5.47 ms, i.e. ~6 GB/s once the copies through the segment dominate."""
    import os

    import torch

    # Imported here: bench sits above platforms, and only this one entry needs its probes.
    from tacit.bench.hw import matmul_flops, peak_read_bandwidth

    threads = torch.get_num_threads()
    measured = f"measured in this process by tacit.bench.hw ({threads} threads)"
    bf16 = matmul_flops(torch.bfloat16, n=1024)
    try:
        mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem_total = 0
    return check_spec(
        HardwareSpec(
            name="this-cpu",
            description=f"this machine's CPU, {threads} threads",
            flops={
                "bf16": Sourced(bf16, measured + ": matmul_flops(bfloat16)"),
                # tacit's int8 (Q8_0) kernels unpack to fp32 and multiply there: no int8 unit is used.
                "int8": Sourced(bf16, measured + ": bf16 matmul stands in (Q8_0 kernels compute in fp32)"),
            },
            memory_bandwidth=Sourced(peak_read_bandwidth(), measured + ": peak_read_bandwidth()"),
            memory_capacity=Sourced(float(mem_total or 1), "sysconf(SC_PHYS_PAGES) * page size"),
            link_bandwidth=Sourced(6.0e9, "docs/benchmarks.md, tacit bench comm (shm, 2 ranks): 32 MB in 5.47 ms"),
            link_latency=Sourced(4.8e-6, "docs/benchmarks.md, tacit bench comm (shm, 2 ranks): 4 KB in 4.8 us"),
            efficiency_profile="this-cpu",
        )
    )
