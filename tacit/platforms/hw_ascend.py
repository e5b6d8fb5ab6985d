"""Huawei Ascend entries of the hardware table: 910B (Atlas 800 A2), 910C (CloudMatrix 384,
per package and per die) and 310P (Atlas 300I Pro, Atlas 300I Duo per chip).

Huawei publishes fewer figures than NVIDIA; what its sheets do not give (HBM bandwidth of a
910B, int8 rates) is an estimate and says so. Graph capture: vLLM-Ascend and MindIE run decode
as ACL graphs on the 910 series by default, and decode-only graphs on the 310P (see its entries).
"""

from __future__ import annotations

from tacit.platforms.specs import HardwareSpec, Sourced

GB = 1e9
GIB = float(1 << 30)
T = 1e12

_ASCEND_910B = (
    "Huawei Atlas 800T/800I A2 product specifications (e.huawei.com/en/products/computing/ascend), Ascend 910B module"
)
_CM384_REG = (
    "The Register, 'Stacking up Huawei's rack-scale boogeyman against Nvidia's best' (2025-07-29): Ascend 910C "
    "= two compute dies, 752 TFLOPS dense FP16/BF16, 128 GB in eight HBM stacks, 1.6 TB/s to each die, "
    "die-to-die link 540 GB/s (270 each way)"
)
_CM384_UB = (
    "Huawei Cloud CloudMatrix 384 project analysis (chinaresearchcollective.substack.com/p/huawei-ascend-"
    "cloudmatrix-384-supernode): UB interconnect 196 GB/s per NPU die, non-blocking all-to-all over 384 NPUs; "
    "Zuo et al., 'Serving Large Language Models on Huawei CloudMatrix384' (arXiv 2506.12708)"
)
_INT8_EST = "estimate: 2x FP16, the ratio Huawei gives for the Ascend 910 (256 TFLOPS FP16 / 512 TOPS INT8)"
_ASCEND_310P = "Huawei Atlas 300I Pro inference card specifications (e.huawei.com/en/products/computing/ascend/atlas-300i-pro), one Ascend 310P"
_ATLAS_DUO = (
    "Huawei Atlas 300I Duo inference card specifications (e.huawei.com/en/products/computing/ascend/atlas-300i-duo): "
    "two Ascend 310P chips, 280 TOPS INT8 / 140 TFLOPS FP16, 96 GB LPDDR4X at 408 GB/s, PCIe 4.0 x16, 150 W"
)
_HCCL_EST = "estimate: HCCL small-message all-reduce step on HCCS / UB, ~10 us"
_ROCE_EST = "estimate: an HCCL step over RoCE (NIC and switch hops), ~15 us"
_PCIE_NIC = "estimate: one 100 GbE NIC per 8 chips of a PCIe inference server (12.5 GB/s / 8)"
# vLLM-Ascend's Atlas 300I DUO tutorial (docs.vllm.ai/projects/ascend/en/latest/tutorials/hardwares/310p.html):
# FULL_DECODE_ONLY graph mode is supported, but with TP > 1 only a few graphs can be captured
# (Qwen3-32B: 2) for want of hardware event ids; other batch sizes then run eagerly
# (`--enforce-eager` prices that).
_310P_GRAPHS = True


def _ascend_910b(name: str, tflops: float, variant: str) -> HardwareSpec:
    return HardwareSpec(
        name=name,
        description=f"Huawei Ascend 910B ({variant}, {tflops:.0f} TFLOPS FP16), Atlas 800 A2",
        flops={
            "fp16": Sourced(tflops * T, _ASCEND_910B + f": FP16 {tflops:.0f} TFLOPS ({variant})"),
            # The Da Vinci cube runs bf16 at the fp16 rate.
            "bf16": Sourced(tflops * T, _ASCEND_910B + f": BF16 at the FP16 rate, {tflops:.0f} TFLOPS ({variant})"),
            "int8": Sourced(2 * tflops * T, _INT8_EST),
        },
        # estimate: Huawei does not publish per-module HBM bandwidth; 1.6 TB/s (4 stacks HBM2e) is
        # the figure commonly reported for 910B, and the one The Register gives per 910C die
        memory_bandwidth=Sourced(1.6e12, "estimate: commonly reported 1.6 TB/s HBM2e for 910B (not in Huawei's sheet)"),
        memory_capacity=Sourced(64 * GIB, _ASCEND_910B + ": 64 GB HBM2e per NPU"),
        # HCCS full mesh in an 8-NPU Atlas 800 A2: 392 GB/s per NPU (both directions) -> 196 each way
        link_bandwidth=Sourced(196 * GB, _ASCEND_910B + ": HCCS 392 GB/s per NPU (both directions), halved"),
        link_latency=Sourced(10e-6, _HCCL_EST),
        devices_per_node=8,
        inter_node_bandwidth=Sourced(25 * GB, _ASCEND_910B + ": one 200GE RoCE port per NPU (25 GB/s)"),
        inter_node_latency=Sourced(15e-6, _ROCE_EST),
        graphs=True,
        efficiency_profile="ascend-910",
    )


def _ascend_910c(name: str, dies: int) -> HardwareSpec:
    """A 910C package (dies=2) or one of its dies (dies=1), as the CloudMatrix 384 joins them:
    the UB network is non-blocking over all 384 packages, so the whole supernode is one node."""
    per = "package" if dies == 2 else "die"
    return HardwareSpec(
        name=name,
        description=f"Huawei Ascend 910C, one {per} ({dies} of its 2 dies), CloudMatrix 384",
        flops={
            "fp16": Sourced(376 * dies * T, _CM384_REG + f": 752 TFLOPS x {dies}/2"),
            "bf16": Sourced(376 * dies * T, _CM384_REG + f": 752 TFLOPS x {dies}/2"),
            "int8": Sourced(2 * 376 * dies * T, _INT8_EST),
        },
        memory_bandwidth=Sourced(1.6e12 * dies, _CM384_REG + f": 1.6 TB/s per die x {dies}"),
        memory_capacity=Sourced(64 * GB * dies, _CM384_REG + f": 128 GB x {dies}/2"),
        link_bandwidth=Sourced(196 * GB * dies, _CM384_UB + f": 196 GB/s per die (one direction) x {dies}"),
        link_latency=Sourced(10e-6, _HCCL_EST),
        devices_per_node=384 * (2 // dies),
        # Beyond one supernode: the RDMA plane (RoCE), 200 Gb/s per die as the paper describes it
        inter_node_bandwidth=Sourced(
            25 * GB * dies, "estimate: CloudMatrix384 RDMA plane, 200 Gb/s per die (arXiv 2506.12708, sec. 3)"
        ),
        inter_node_latency=Sourced(15e-6, _ROCE_EST),
        graphs=True,
        efficiency_profile="ascend-910",
    )


def _ascend_310p(name: str, description: str, source: str, capacity: float, bandwidth: float) -> HardwareSpec:
    return HardwareSpec(
        name=name,
        description=description,
        flops={
            "fp16": Sourced(70 * T, source + ": 70 TFLOPS FP16 per 310P"),
            # no bf16 unit: a bf16 model runs in fp16 on it
            "bf16": Sourced(70 * T, source + ": no BF16 unit, the 70 TFLOPS FP16 figure"),
            "int8": Sourced(140 * T, source + ": 140 TOPS INT8 per 310P"),
        },
        memory_bandwidth=Sourced(bandwidth, source + f": LPDDR4X {bandwidth / GB:.1f} GB/s per chip"),
        memory_capacity=Sourced(capacity, source + f": {capacity / GB:.0f} GB LPDDR4X per chip"),
        link_bandwidth=Sourced(31.5 * GB, source + ": PCIe 4.0 x16, 31.5 GB/s each way"),
        link_latency=Sourced(20e-6, "estimate: collectives through the host over PCIe, ~20 us a step"),
        # estimate: a PCIe inference server (Atlas 800 inference server, model 3000) holds 8 chips
        devices_per_node=8,
        inter_node_bandwidth=Sourced(12.5 * GB / 8, _PCIE_NIC),
        inter_node_latency=Sourced(20e-6, _ROCE_EST),
        graphs=_310P_GRAPHS,
        efficiency_profile="ascend-310p",
    )


ASCEND: dict[str, HardwareSpec] = {
    # The 910B ships in several bins; the 313 TFLOPS one (910B3) is the part usually quoted.
    "ascend-910b": _ascend_910b("ascend-910b", 313, "910B3"),
    "ascend-910b-313t": _ascend_910b("ascend-910b-313t", 313, "910B3"),
    "ascend-910b-376t": _ascend_910b("ascend-910b-376t", 376, "910B2"),
    "ascend-910c": _ascend_910c("ascend-910c", 2),
    "ascend-910c-die": _ascend_910c("ascend-910c-die", 1),
    "ascend-310p": _ascend_310p(
        "ascend-310p", "Huawei Ascend 310P (Atlas 300I Pro card, one chip)", _ASCEND_310P, 24 * GIB, 204.8 * GB
    ),
    # As sold: a card is two 310P chips on one PCIe x16 slot; the engine sees two devices, so
    # the figures are per chip (the card's halved). The 96 GB card: 48 GB per chip.
    "atlas-300i-duo": _ascend_310p(
        "atlas-300i-duo",
        "Huawei Atlas 300I Duo 96GB, one of its two 310P chips",
        _ATLAS_DUO + " (halved)",
        48 * GB,
        204 * GB,
    ),
}
