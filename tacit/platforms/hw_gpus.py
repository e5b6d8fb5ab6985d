"""GPU entries of the hardware table (NVIDIA, AMD): datasheet figures, each with its source.

Conventions as in hardware_table.py: dense FLOP/s, one direction of a link. The node is the HGX /
OAM baseboard the part is sold on (8 GPUs joined by NVLink / Infinity Fabric); the inter-node
figures are the NIC each GPU has in the vendor's reference system (DGX: one 400 Gb/s ConnectX-7
per GPU = 50 GB/s). Serving engines capture decode steps as CUDA/HIP graphs on all of them by
default (vLLM, SGLang), so `graphs` is True; `tacit predict --enforce-eager` prices the launches.
"""

from __future__ import annotations

from tacit.platforms.specs import HardwareSpec, Sourced

GB = 1e9
GIB = float(1 << 30)
T = 1e12

_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 80GB SXM column"
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet), H100 SXM column"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/), H200 SXM column"
_B200_DS = "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx/), 8-GPU board figures divided by 8"
_L40S_DS = "NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s/)"
_MI300X_DS = "AMD Instinct MI300X data sheet (amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf)"
_DGX_A100 = "NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU (25 GB/s)"
_DGX_H100 = "NVIDIA DGX H100/H200 datasheet: 8x single-port ConnectX-7 400 Gb/s InfiniBand, one per GPU (50 GB/s)"
_DGX_B200 = "NVIDIA DGX B200 datasheet: 8x single-port ConnectX-7 400 Gb/s InfiniBand, one per GPU (50 GB/s)"
_NCCL_EST = "estimate: NCCL small-message all-reduce step inside one NVSwitch node is a few us (no datasheet figure)"
_IB_EST = "estimate: an NCCL step over InfiniBand/RoCE (NIC, switch and PCIe hops) is ~10 us (no datasheet figure)"
_HGX8 = "HGX / DGX baseboard: 8 GPUs on one NVSwitch fabric"
_HOPPER_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper: the H100 SXM5 GPU has 132 SMs (H200: the same GH100)"


def _nvlink_node(datasheet: str, nvlink_each_way: float, nic: str, nic_bw: float) -> dict:
    return dict(
        link_bandwidth=Sourced(
            nvlink_each_way, datasheet + f": NVLink {2 * nvlink_each_way / GB:.0f} GB/s (both directions), halved"
        ),
        link_latency=Sourced(6e-6, _NCCL_EST),
        devices_per_node=8,
        inter_node_bandwidth=Sourced(nic_bw, nic),
        inter_node_latency=Sourced(10e-6, _IB_EST),
        graphs=True,
    )


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
        efficiency_profile="nvidia-hopper",
        sms=Sourced(132, _HOPPER_WP),
        **_nvlink_node(datasheet, 450 * GB, _DGX_H100, 50 * GB),
    )


GPUS: dict[str, HardwareSpec] = {
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
        efficiency_profile="nvidia-ampere",
        **_nvlink_node(_A100_DS, 300 * GB, _DGX_A100, 25 * GB),
    ),
    "h100-sxm": _h100_like("h100-sxm", "NVIDIA H100 SXM5 80GB", _H100_DS, 3.35e12, 80 * GIB),
    "h200-sxm": _h100_like("h200-sxm", "NVIDIA H200 SXM 141GB", _H200_DS, 4.8e12, 141 * GB),
    "b200": HardwareSpec(
        name="b200",
        description="NVIDIA B200 (HGX B200, 180 GB HBM3e)",
        flops={
            # HGX B200 (8 GPUs): FP16/BF16 36 PFLOPS, FP8 72, INT8 72 POPS, FP4 144, all with sparsity
            "bf16": Sourced(2250 * T, _B200_DS + ": FP16/BF16 Tensor Core 36 PFLOPS with sparsity / 8 / 2"),
            "fp16": Sourced(2250 * T, _B200_DS + ": FP16/BF16 Tensor Core 36 PFLOPS with sparsity / 8 / 2"),
            "fp8": Sourced(4500 * T, _B200_DS + ": FP8/FP6 Tensor Core 72 PFLOPS with sparsity / 8 / 2"),
            "int8": Sourced(4500 * T, _B200_DS + ": INT8 Tensor Core 72 POPS with sparsity / 8 / 2"),
            "fp4": Sourced(9000 * T, _B200_DS + ": FP4 Tensor Core 144 PFLOPS with sparsity / 8 / 2"),
        },
        memory_bandwidth=Sourced(8e12, _B200_DS + ": 64 TB/s HBM3e bandwidth / 8 = 8 TB/s"),
        memory_capacity=Sourced(180 * GB, _B200_DS + ": 1,440 GB HBM3e / 8 = 180 GB"),
        efficiency_profile="nvidia-blackwell",
        **_nvlink_node(_B200_DS + " (fifth-generation NVLink)", 900 * GB, _DGX_B200, 50 * GB),
    ),
    "l40s": HardwareSpec(
        name="l40s",
        description="NVIDIA L40S 48GB (PCIe, no NVLink)",
        flops={
            "bf16": Sourced(362.05 * T, _L40S_DS + ": BF16 Tensor Core 362.05 TFLOPS (733 with sparsity)"),
            "fp16": Sourced(362.05 * T, _L40S_DS + ": FP16 Tensor Core 362.05 TFLOPS (733 with sparsity)"),
            "fp8": Sourced(733 * T, _L40S_DS + ": FP8 Tensor Core 733 TFLOPS (1,466 with sparsity)"),
            "int8": Sourced(733 * T, _L40S_DS + ": INT8 Tensor Core 733 TOPS (1,466 with sparsity)"),
        },
        memory_bandwidth=Sourced(864 * GB, _L40S_DS + ": 864 GB/s GDDR6"),
        memory_capacity=Sourced(48 * GB, _L40S_DS + ": 48 GB GDDR6 with ECC"),
        # no NVLink: peers talk over PCIe Gen4 x16, 64 GB/s both directions
        link_bandwidth=Sourced(32 * GB, _L40S_DS + ": PCIe Gen4 x16 64 GB/s bidirectional, halved"),
        link_latency=Sourced(15e-6, "estimate: an NCCL step over PCIe through the host bridge, ~15 us"),
        devices_per_node=8,
        inter_node_bandwidth=Sourced(
            25 * GB, "estimate: NVIDIA's L40S OVX reference server pairs one 400 Gb/s NIC with two GPUs (25 GB/s each)"
        ),
        inter_node_latency=Sourced(10e-6, _IB_EST),
        graphs=True,
        efficiency_profile="nvidia-ada",
    ),
    "mi300x": HardwareSpec(
        name="mi300x",
        description="AMD Instinct MI300X 192GB (OAM)",
        flops={
            "bf16": Sourced(1307.4 * T, _MI300X_DS + ": peak BF16 1,307.4 TFLOPS dense (2,614.9 with sparsity)"),
            "fp16": Sourced(1307.4 * T, _MI300X_DS + ": peak FP16 1,307.4 TFLOPS dense (2,614.9 with sparsity)"),
            "fp8": Sourced(2614.9 * T, _MI300X_DS + ": peak FP8 2,614.9 TFLOPS dense (5,229.8 with sparsity)"),
            "int8": Sourced(2614.9 * T, _MI300X_DS + ": peak INT8 2,614.9 TOPS dense (5,229.8 with sparsity)"),
        },
        memory_bandwidth=Sourced(5.3e12, _MI300X_DS + ": 5.3 TB/s HBM3"),
        memory_capacity=Sourced(192 * GB, _MI300X_DS + ": 192 GB HBM3"),
        # 7 Infinity Fabric links of 128 GB/s (both directions) to the 7 peers of an 8-GPU platform
        link_bandwidth=Sourced(448 * GB, _MI300X_DS + ": 7 Infinity Fabric links x 128 GB/s bidirectional, halved"),
        link_latency=Sourced(8e-6, "estimate: an RCCL small-message step over Infinity Fabric, a few us"),
        devices_per_node=8,
        inter_node_bandwidth=Sourced(
            50 * GB,
            "Microsoft Azure ND MI300X v5 sizes (learn.microsoft.com/en-us/azure/virtual-machines/sizes/"
            "gpu-accelerated/ndmi300xv5-series): 400 Gb/s InfiniBand per GPU",
        ),
        inter_node_latency=Sourced(10e-6, _IB_EST),
        graphs=True,  # vLLM/SGLang on ROCm capture HIP graphs by default
        efficiency_profile="amd-cdna3",
    ),
}
