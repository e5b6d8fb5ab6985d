"""Server CPU entries of the hardware table: one socket is one device; a node is a two-socket
server whose sockets talk over UPI (Intel) or xGMI (AMD); no engine captures graphs on a CPU.

FLOP/s are derived from the core count, the base clock and the matrix unit's FLOP per cycle per
core, because Intel and AMD publish those, not a TFLOPS figure:
- Intel AMX (Sapphire / Emerald / Granite Rapids): 1024 BF16 (and, on Granite Rapids, FP16) or
  2048 INT8 operations per cycle per core (Intel 64 and IA-32 Architectures Optimization Reference
  Manual, AMX chapter). Base clock, because AMX-heavy code runs at or below it, not at turbo.
- AMD has no AMX; its GEMMs run AVX-512 VDPBF16PS / VPDPBUSD. Zen 4 executes a 512-bit op as two
  256-bit halves on its two FMA pipes: 64 BF16 FLOP and 128 INT8 ops per cycle per core. Zen 5
  in EPYC 9005 has the full 512-bit datapath: 128 BF16 FLOP and 256 INT8 ops per cycle per core
  (AMD Software Optimization Guides for Family 19h (pub. 57647) and 1Ah (pub. 58455)).
Memory bandwidth is channels x MT/s x 8 bytes; capacity is a stated configuration (one 64 GB
DIMM per channel), since a socket takes terabytes.
"""

from __future__ import annotations

from tacit.platforms.specs import HardwareSpec, Sourced

GB = 1e9
T = 1e12

_AMX = "Intel AMX: 1024 BF16 / 2048 INT8 operations per cycle per core (Intel 64 and IA-32 Optimization Reference Manual, AMX chapter)"
_ZEN4 = "AMD Zen 4 AVX-512 (two 256-bit FMA pipes): 64 BF16 FLOP / 128 INT8 ops per cycle per core (AMD Software Optimization Guide for Family 19h, pub. 57647)"
_ZEN5 = "AMD Zen 5 AVX-512 (full 512-bit datapath in EPYC 9005): 128 BF16 FLOP / 256 INT8 ops per cycle per core (AMD Software Optimization Guide for Family 1Ah, pub. 58455)"
_GNR_LUXX = (
    "Intel Xeon 6900P launch specifications (ark.intel.com; table in hardwareluxx.de 'Intels Comeback: Granite Rapids "
    "mit 96 Kernen im Test', 2024-09)"
)
_EPYC_9004 = "AMD EPYC 9004 Series Architecture Overview (amd.com, pub. 58015): 12 DDR5-4800 channels, up to 4 xGMI links of x16 at 32 Gb/s between sockets"
_EPYC_9005 = "AMD EPYC 9005 Series Processor Architecture Overview (amd.com, pub. 58462): 12 DDR5-6000 channels, up to 4 xGMI links of x16 at 32 Gb/s between sockets"
_NIC_EST = "estimate: one 100 GbE NIC per socket (12.5 GB/s), the common two-socket server configuration"
_MPI_EST = "estimate: an MPI/gloo step over TCP or RoCE between servers, ~20 us"
_SHM_EST = "estimate: a shared-memory all-reduce step across sockets, ~2 us"


def _cpu(
    name: str,
    description: str,
    *,
    flops: tuple[float, float, str, int],  # (bf16, int8, source, cores)
    fp16: bool,
    bandwidth: tuple[float, str],
    link: tuple[float, str],
    profile: str,
    dimms: int = 12,
) -> HardwareSpec:
    bf16, int8, fsrc, cores = flops
    f = {"bf16": Sourced(bf16, fsrc), "int8": Sourced(int8, fsrc)}
    if fp16:  # AMX-FP16 (Granite Rapids): the bf16 rate
        f["fp16"] = Sourced(bf16, fsrc + "; AMX-FP16 at the BF16 rate")
    return HardwareSpec(
        name=name,
        description=description,
        flops=f,
        memory_bandwidth=Sourced(*bandwidth),
        memory_capacity=Sourced(
            dimms * 64 * GB, f"estimate: a configuration of {dimms} x 64 GB DIMMs, one per channel"
        ),
        link_bandwidth=Sourced(*link),
        link_latency=Sourced(2e-6, _SHM_EST),
        devices_per_node=2,
        inter_node_bandwidth=Sourced(12.5 * GB, _NIC_EST),
        inter_node_latency=Sourced(20e-6, _MPI_EST),
        graphs=False,
        efficiency_profile=profile,
        cores=cores,
    )


def _amx(cores: int, ghz: float, src: str) -> tuple[float, float, str, int]:
    return cores * 1024 * ghz * 1e9, cores * 2048 * ghz * 1e9, f"{_AMX}; {src}: {cores} cores, {ghz} GHz base", cores


def _zen(cores: int, ghz: float, per_cycle: int, arch: str, src: str) -> tuple[float, float, str, int]:
    return (
        cores * per_cycle * ghz * 1e9,
        cores * 2 * per_cycle * ghz * 1e9,
        f"{arch}; {src}: {cores} cores, {ghz} GHz base",
        cores,
    )


def _gnr(name: str, cores: int, ghz: float, mts: int, kind: str) -> HardwareSpec:
    # Granite Rapids-AP: 12 channels of DDR5-6400 or MRDIMM-8800; 6 UPI 2.0 links at 24 GT/s
    # (2 bytes a transfer each way: 48 GB/s per link)
    return _cpu(
        name,
        f"Intel Xeon {name.split('-')[1].upper()} (Granite Rapids, {cores} cores, AMX, 12 ch {kind}-{mts}), one socket",
        flops=_amx(cores, ghz, _GNR_LUXX),
        fp16=True,
        bandwidth=(12 * mts * 8e6, f"{_GNR_LUXX}: 12 channels {kind}-{mts} (12 x {mts * 8 / 1000:.1f} GB/s)"),
        link=(6 * 48 * GB, _GNR_LUXX + ": 6 UPI 2.0 links at 24 GT/s (48 GB/s each way per link)"),
        profile="granite-rapids",
    )


_SPR_ARK = "Intel ARK, Intel Xeon Platinum 8480+ (ark.intel.com/content/www/us/en/ark/products/231746)"
_EMR_ARK = "Intel ARK, Intel Xeon Platinum 8592+ (ark.intel.com, 5th Gen Xeon Scalable)"

CPUS: dict[str, HardwareSpec] = {
    # Intel's AI serving figures for the 6980P use MRDIMM-8800; the DDR5-6400 entry is the plain RDIMM build.
    "xeon-6980p": _gnr("xeon-6980p", 128, 2.0, 8800, "MRDIMM"),
    "xeon-6980p-ddr5": _gnr("xeon-6980p-ddr5", 128, 2.0, 6400, "DDR5"),
    "xeon-6972p": _gnr("xeon-6972p", 96, 2.4, 6400, "DDR5"),
    "xeon-6960p": _gnr("xeon-6960p", 72, 2.7, 6400, "DDR5"),
    "xeon-8592plus": _cpu(
        "xeon-8592plus",
        "Intel Xeon Platinum 8592+ (Emerald Rapids, 64 cores, AMX), one socket",
        flops=_amx(64, 1.9, _EMR_ARK),
        fp16=False,
        bandwidth=(8 * 5600 * 8e6, _EMR_ARK + ": 8 channels DDR5-5600 (8 x 44.8 GB/s)"),
        link=(4 * 40 * GB, _EMR_ARK + ": 4 UPI links at 20 GT/s (40 GB/s each way per link)"),
        profile="sapphire-rapids",
        dimms=8,
    ),
    "xeon-8480plus": _cpu(
        "xeon-8480plus",
        "Intel Xeon Platinum 8480+ (Sapphire Rapids, 56 cores, AMX), one socket",
        flops=_amx(56, 2.0, _SPR_ARK),
        fp16=False,
        bandwidth=(307.2 * GB, _SPR_ARK + ": 8 channels DDR5-4800 (8 x 38.4 GB/s)"),
        link=(128 * GB, _SPR_ARK + ": 4 UPI links at 16 GT/s (32 GB/s each way per link)"),
        profile="sapphire-rapids",
        dimms=8,
    ),
    "epyc-9654": _cpu(
        "epyc-9654",
        "AMD EPYC 9654 (Genoa, 96 Zen 4 cores, AVX-512 BF16), one socket",
        flops=_zen(
            96,
            2.4,
            64,
            _ZEN4,
            "AMD EPYC 9654 product page (amd.com/en/products/processors/server/epyc/4th-generation-9004-and-8004-series/amd-epyc-9654.html)",
        ),
        fp16=False,
        bandwidth=(12 * 4800 * 8e6, _EPYC_9004 + ": 12 x 38.4 GB/s"),
        link=(4 * 64 * GB, _EPYC_9004 + ": 4 x16 links at 32 Gb/s = 64 GB/s each way per link"),
        profile="epyc-zen4",
    ),
    "epyc-9175f": _cpu(
        "epyc-9175f",
        "AMD EPYC 9175F (Turin, 16 Zen 5 cores at 4.2 GHz, 512 MB L3), one socket",
        flops=_zen(
            16,
            4.2,
            128,
            _ZEN5,
            "AMD EPYC 9175F product page (amd.com/en/products/processors/server/epyc/9005-series/amd-epyc-9175f.html)",
        ),
        fp16=False,
        bandwidth=(12 * 6000 * 8e6, _EPYC_9005 + ": 12 x 48 GB/s"),
        link=(4 * 64 * GB, _EPYC_9005 + ": 4 x16 links at 32 Gb/s = 64 GB/s each way per link"),
        profile="epyc-zen5",
    ),
    "epyc-9965": _cpu(
        "epyc-9965",
        "AMD EPYC 9965 (Turin dense, 192 Zen 5c cores), one socket",
        flops=_zen(
            192,
            2.25,
            128,
            _ZEN5,
            "AMD EPYC 9965 product page (amd.com/en/products/processors/server/epyc/9005-series/amd-epyc-9965.html)",
        ),
        fp16=False,
        bandwidth=(12 * 6000 * 8e6, _EPYC_9005 + ": 12 x 48 GB/s"),
        link=(4 * 64 * GB, _EPYC_9005 + ": 4 x16 links at 32 Gb/s = 64 GB/s each way per link"),
        profile="epyc-zen5",
    ),
}
