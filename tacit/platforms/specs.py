"""HardwareSpec: the ceilings a performance model divides by, each figure with its source.

A prediction is only as good as the roofs under it, so every field is a `Sourced` value: the
number and where it comes from (a datasheet, a measurement, or an estimate said to be one).
The table itself is `hardware_table.py`; `this-cpu` is measured in this process, once.
FLOP/s are DENSE: a datasheet's "with sparsity" figure is twice what a dense GEMM can reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


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
    link_bandwidth: Sourced  # bytes/s one device sends (one direction) to its peers in its node
    link_latency: Sourced  # seconds per step of a collective inside a node
    # The efficiency profile in tacit/perf_model/data/efficiency.json this part uses: one per
    # family (nvidia-hopper, epyc-zen4, ...); an empty name is refused by check_spec.
    efficiency_profile: str = ""
    extra: dict[str, Sourced] = field(default_factory=dict)
    # Devices one node's fast links (NVLink, HCCS, UPI) join; a collective over more of them
    # crosses the inter-node network (InfiniBand / RoCE), whose figures are the two below.
    devices_per_node: int = 1
    inter_node_bandwidth: Sourced | None = None  # bytes/s one device sends, one direction
    inter_node_latency: Sourced | None = None  # seconds per step of a collective across nodes
    # Whether serving engines capture decode steps as graphs on this part (CUDA graphs, Ascend's
    # ACL graphs) by default, so kernel launches cost a graph replay, not one launch each;
    # `tacit predict --enforce-eager` prices the launches instead.
    graphs: bool = False
    # A CPU's physical cores in one device (socket): `tacit predict --threads N` prices its
    # compute at min(N, cores) of them (with_threads); None on parts that have no such knob.
    cores: int | None = None
    # An NVIDIA GPU's streaming multiprocessors: SGLang's prefill under two-batch overlap runs
    # DeepGEMM on those DeepEP's normal kernels leave it (micro_batch_overlap.py); None: not stated.
    sms: Sourced | None = None

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
        for key in ("inter_node_bandwidth", "inter_node_latency", "sms"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update({f"extra[{k}]": v for k, v in self.extra.items()})
        return out


def check_spec(spec: HardwareSpec) -> HardwareSpec:
    """Refuse an entry with a field that does not say where its number comes from, or a
    non-positive number (a zero bandwidth would divide by zero far from here)."""
    if (
        isinstance(spec.devices_per_node, bool)
        or not isinstance(spec.devices_per_node, int)
        or spec.devices_per_node < 1
    ):
        raise ValueError(
            f"hardware {spec.name!r}: devices_per_node must be an integer >= 1, got {spec.devices_per_node!r}"
        )
    if spec.cores is not None and (isinstance(spec.cores, bool) or not isinstance(spec.cores, int) or spec.cores < 1):
        raise ValueError(f"hardware {spec.name!r}: cores must be an integer >= 1, got {spec.cores!r}")
    if not spec.efficiency_profile.strip():
        raise ValueError(f"hardware {spec.name!r}: efficiency_profile is empty; name a profile of efficiency.json")
    if "bf16" not in spec.flops:
        raise ValueError(f"hardware {spec.name!r}: flops has no 'bf16' entry (has {sorted(spec.flops)})")
    for key, v in spec.sourced_fields().items():
        if not isinstance(v, Sourced) or not str(v.source).strip():
            raise ValueError(f"hardware {spec.name!r}: field {key} has no source")
        if not v.value > 0:
            raise ValueError(f"hardware {spec.name!r}: field {key} must be > 0, got {v.value!r}")
    return spec


def with_threads(spec: HardwareSpec, threads: int) -> HardwareSpec:
    """`spec` as an engine running `threads` compute threads on it prices it (llama.cpp's `-t`):
    every FLOP/s figure times min(threads, cores) / cores, since a core's vector and matrix units
    serve its own threads and SMT siblings past the physical cores add none.

    Memory bandwidth is left as it is. A socket's DRAM saturates on a STREAM-like read well
    below all its cores, but an engine's bandwidth fraction in efficiency.json was measured at
    the thread count its source ran (all the cores, for every CPU profile shipped) and folds in
    the compute a quantized decode spends dequantising; so with fewer threads a real decode is
    slower than this prices it (ubergarm found 64 and 80 threads slower than 128 for a 72B's
    generation on a Xeon 6980P: ik_llama.cpp PR 534)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads must be an integer >= 1, got {threads!r}")
    if spec.cores is None:
        if spec.name == "this-cpu":  # its fit is keyed by the threads torch runs (calibration.machine_key)
            raise ValueError(
                "--threads does not go with this-cpu: it is priced by a fit made at the threads torch runs "
                "(OMP_NUM_THREADS), refitted when they change"
            )
        raise ValueError(
            f"--threads prices a CPU's compute by its cores; hardware {spec.name!r} states none "
            "(a CPU of the table, or a --hardware-file with a `cores` field)"
        )
    used = min(threads, spec.cores)
    scale = used / spec.cores
    note = f"; x {used}/{spec.cores} cores (--threads {threads})"
    flops = {k: Sourced(v.value * scale, v.source + note) for k, v in spec.flops.items()}
    smt = f", {threads - spec.cores} past the cores adding no compute" if threads > spec.cores else ""
    return replace(
        spec,
        flops=flops,
        description=f"{spec.description}, {threads} threads ({used} of {spec.cores} cores' compute{smt})",
    )
