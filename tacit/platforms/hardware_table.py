"""The hardware table: datasheet figures per part, each with its source (see specs.py).

Conventions, so entries compare: FLOP/s are dense (half a datasheet's "with sparsity" figure);
memory capacity in bytes as the vendor counts it; link bandwidth is what ONE device sends in
ONE direction (NVIDIA quotes NVLink both ways added: 900 GB/s on H100 is 450 GB/s each way);
link latency is the per-step cost of a small collective, which no datasheet gives: those are
estimates and say so.
"""

from __future__ import annotations

import functools

from tacit.platforms.hw_probe import matmul_flops, peak_read_bandwidth
from tacit.platforms.specs import HardwareSpec, Sourced, check_spec

GB = 1e9
GIB = float(1 << 30)
T = 1e12

_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 80GB SXM column"
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet), H100 SXM column"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/), H200 SXM column"
_NCCL_EST = "estimate: NCCL small-message all-reduce step inside one NVSwitch node is a few us (no datasheet figure)"
_ASCEND_910B = (
    "Huawei Atlas 800T/800I A2 product specifications (e.huawei.com/en/products/computing/ascend), Ascend 910B module"
)
_ASCEND_910C = (
    "Huawei CloudMatrix 384 / Atlas 900 A3 SuperPoD announcements (huawei.com, 2025): Ascend 910C = two 910B-class dies"
)
_ASCEND_310P = "Huawei Atlas 300I Pro inference card specifications (e.huawei.com/en/products/computing/ascend/atlas-300i-pro), one Ascend 310P"
_XEON_ARK = "Intel ARK, Intel Xeon Platinum 8480+ (ark.intel.com/content/www/us/en/ark/products/231746)"
_AMX = "Intel AMX: 1024 BF16 / 2048 INT8 FLOP per cycle per core (Intel 64 and IA-32 Optimization Reference Manual, AMX chapter)"


def _h100_like(name: str, description: str, datasheet: str, bw: float, capacity: float) -> HardwareSpec:
    # H100 and H200 SXM share the GH100 die and its tensor cores: the same FLOP/s.
    return HardwareSpec(
        name=name,
        description=description,
        flops={
            # datasheet: 1,979 TFLOPS "with sparsity" -> 989.5 dense
            "bf16": Sourced(989.5 * T, datasheet + ": BF16 Tensor Core 1,979 TFLOPS with sparsity, halved"),
            "fp16": Sourced(989.5 * T, datasheet + ": FP16 Tensor Core 1,979 TFLOPS with sparsity, halved"),
            "fp8": Sourced(1979 * T, datasheet + ": FP8 Tensor Core 3,958 TFLOPS with sparsity, halved"),
            "int8": Sourced(1979 * T, datasheet + ": INT8 Tensor Core 3,958 TOPS with sparsity, halved"),
        },
        memory_bandwidth=Sourced(bw, datasheet + ": GPU memory bandwidth"),
        memory_capacity=Sourced(capacity, datasheet + ": GPU memory"),
        link_bandwidth=Sourced(450 * GB, datasheet + ": NVLink 900 GB/s (both directions), 450 each way"),
        link_latency=Sourced(6e-6, _NCCL_EST),
        efficiency_profile="accelerator",
    )


def _ascend_910b(name: str, tflops: float, variant: str) -> HardwareSpec:
    return HardwareSpec(
        name=name,
        description=f"Huawei Ascend 910B ({variant}, {tflops:.0f} TFLOPS FP16)",
        flops={
            "fp16": Sourced(tflops * T, _ASCEND_910B + f": FP16 {tflops:.0f} TFLOPS ({variant})"),
            # The Da Vinci cube runs bf16 at the fp16 rate.
            "bf16": Sourced(tflops * T, _ASCEND_910B + f": BF16 at the FP16 rate, {tflops:.0f} TFLOPS ({variant})"),
            # estimate: the cube's int8 rate is twice fp16 (Ascend 910: 256 TFLOPS FP16 / 512 TOPS INT8)
            "int8": Sourced(2 * tflops * T, "estimate: 2x FP16, the ratio Huawei gives for the Ascend 910 (256/512)"),
        },
        # estimate: Huawei does not publish per-module HBM bandwidth; 1.6 TB/s (4 stacks HBM2e) is
        # the figure commonly reported for 910B
        memory_bandwidth=Sourced(1.6e12, "estimate: commonly reported 1.6 TB/s HBM2e for 910B (not in Huawei's sheet)"),
        memory_capacity=Sourced(64 * GIB, _ASCEND_910B + ": 64 GB HBM2e per NPU"),
        # HCCS full mesh in an 8-NPU Atlas 800 A2: 392 GB/s per NPU (both directions) -> 196 each way
        link_bandwidth=Sourced(196 * GB, _ASCEND_910B + ": HCCS 392 GB/s per NPU (both directions), halved"),
        link_latency=Sourced(10e-6, "estimate: HCCL small-message all-reduce step on HCCS, ~10 us"),
    )


TABLE: dict[str, HardwareSpec] = {
    "a100-80g": HardwareSpec(
        name="a100-80g",
        description="NVIDIA A100 80GB SXM",
        flops={
            # A100 has no fp8 unit: fp8 weights are multiplied in bf16 (HardwareSpec.peak_flops)
            "bf16": Sourced(312 * T, _A100_DS + ": BFLOAT16 Tensor Core 312 TFLOPS (624 with sparsity)"),
            "fp16": Sourced(312 * T, _A100_DS + ": FP16 Tensor Core 312 TFLOPS (624 with sparsity)"),
            "int8": Sourced(624 * T, _A100_DS + ": INT8 Tensor Core 624 TOPS (1,248 with sparsity)"),
        },
        memory_bandwidth=Sourced(2039 * GB, _A100_DS + ": GPU memory bandwidth 2,039 GB/s"),
        memory_capacity=Sourced(80 * GIB, _A100_DS + ": 80GB HBM2e (81,920 MiB)"),
        link_bandwidth=Sourced(300 * GB, _A100_DS + ": NVLink 600 GB/s (both directions), 300 each way"),
        link_latency=Sourced(8e-6, _NCCL_EST),
    ),
    "h100-sxm": _h100_like("h100-sxm", "NVIDIA H100 SXM5 80GB", _H100_DS, 3.35e12, 80 * GIB),
    "h200-sxm": _h100_like("h200-sxm", "NVIDIA H200 SXM 141GB", _H200_DS, 4.8e12, 141 * GB),
    # The 910B ships in several bins; the 313 TFLOPS one (910B3) is the part usually quoted.
    "ascend-910b": _ascend_910b("ascend-910b", 313, "910B3"),
    "ascend-910b-313t": _ascend_910b("ascend-910b-313t", 313, "910B3"),
    "ascend-910b-376t": _ascend_910b("ascend-910b-376t", 376, "910B2"),
    "ascend-910c": HardwareSpec(
        name="ascend-910c",
        description="Huawei Ascend 910C (two 910B-class dies in one package)",
        flops={
            "fp16": Sourced(800 * T, _ASCEND_910C + ": 800 TFLOPS FP16"),
            "bf16": Sourced(800 * T, _ASCEND_910C + ": BF16 at the FP16 rate, 800 TFLOPS"),
            "int8": Sourced(1600 * T, "estimate: 2x FP16, the ratio Huawei gives for the Ascend 910 (256/512)"),
        },
        memory_bandwidth=Sourced(3.2e12, "estimate: two 910B dies, 2 x 1.6 TB/s HBM"),
        memory_capacity=Sourced(128 * GB, _ASCEND_910C + ": 128 GB HBM"),
        # 784 GB/s unified-bus bandwidth per NPU as announced; read as both directions -> 392 each way
        link_bandwidth=Sourced(392 * GB, _ASCEND_910C + ": 784 GB/s interconnect per NPU (both directions), halved"),
        link_latency=Sourced(10e-6, "estimate: HCCL small-message all-reduce step, ~10 us"),
    ),
    "ascend-310p": HardwareSpec(
        name="ascend-310p",
        description="Huawei Ascend 310P (Atlas 300I Pro card)",
        flops={
            "fp16": Sourced(70 * T, _ASCEND_310P + ": 70 TFLOPS FP16"),
            # no bf16 unit: a bf16 model runs in fp16 on it
            "bf16": Sourced(70 * T, _ASCEND_310P + ": no BF16 unit, the 70 TFLOPS FP16 figure"),
            "int8": Sourced(140 * T, _ASCEND_310P + ": 140 TOPS INT8"),
        },
        memory_bandwidth=Sourced(204.8 * GB, _ASCEND_310P + ": LPDDR4X 204.8 GB/s"),
        memory_capacity=Sourced(24 * GIB, _ASCEND_310P + ": 24 GB LPDDR4X"),
        link_bandwidth=Sourced(31.5 * GB, _ASCEND_310P + ": PCIe 4.0 x16, 31.5 GB/s each way"),
        link_latency=Sourced(20e-6, "estimate: collectives through the host over PCIe, ~20 us a step"),
    ),
    "xeon-8480plus": HardwareSpec(
        name="xeon-8480plus",
        description="Intel Xeon Platinum 8480+ (Sapphire Rapids, 56 cores, AMX), one socket",
        flops={
            # 56 cores x 1024 FLOP/cycle x 2.0 GHz base = 114.7 TFLOP/s; AMX clocks can sit lower
            "bf16": Sourced(56 * 1024 * 2.0e9, _AMX + "; " + _XEON_ARK + ": 56 cores, 2.0 GHz base"),
            "int8": Sourced(56 * 2048 * 2.0e9, _AMX + "; " + _XEON_ARK + ": 56 cores, 2.0 GHz base"),
        },
        # 8 channels x DDR5-4800 x 8 bytes = 307.2 GB/s per socket
        memory_bandwidth=Sourced(307.2 * GB, _XEON_ARK + ": 8 channels DDR5-4800 (8 x 38.4 GB/s)"),
        memory_capacity=Sourced(
            512 * GIB, "estimate: a configuration of 16 x 32 GB DDR5 per socket (" + _XEON_ARK + ": 4 TB max)"
        ),
        # 4 UPI 2.0 links at 16 GT/s x 2 bytes = 32 GB/s each way per link
        link_bandwidth=Sourced(128 * GB, _XEON_ARK + ": 4 UPI links at 16 GT/s (32 GB/s each way per link)"),
        link_latency=Sourced(2e-6, "estimate: a shared-memory all-reduce step across sockets, ~2 us"),
        efficiency_profile="cpu",
    ),
}


def hardware_names() -> list[str]:
    return [*TABLE, "this-cpu"]


def get_hardware_spec(name: str) -> HardwareSpec:
    """The spec of `name` (see hardware_names()); `this-cpu` is measured once per process."""
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

    threads = torch.get_num_threads()
    measured = f"measured in this process by tacit.platforms.hw_probe ({threads} threads)"
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
