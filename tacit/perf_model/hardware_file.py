"""`tacit predict --hardware-file FILE`: a machine the table does not have, described in YAML or
JSON, becomes a HardwareSpec (every figure with its source, as the table's) and, when the file
brings its own efficiency profile inline, a profile registered for this process.

The file (units in the key names; examples/hardware/epyc-9554-two-socket.yaml is one):

    name: my-server                       # required
    description: ...                      # optional
    source: "where the figures come from" # covers every figure without its own
    memory_capacity_gb: 768
    memory_bandwidth_gb_s: 460.8
    flops_tflops: {bf16: 12.3, int8: 24.6}  # bf16 required
    link_bandwidth_gb_s: 64               # one device to its peers in a node, one direction
    link_latency_us: 2
    devices_per_node: 2
    inter_node_bandwidth_gb_s: 12.5       # optional, with inter_node_latency_us
    inter_node_latency_us: 20
    graphs: false                         # engines capture decode steps as graphs
    cores: 64                             # a CPU's physical cores a device: --threads N prices min(N, cores) of them
    sms: 132                              # a GPU's streaming multiprocessors (DeepEP's normal kernels hold 20 of them)
    efficiency_profile: epyc-zen4         # a name in efficiency.json, or a mapping in its schema (same_as: NAME and what differs)

A figure is a number or {value: N, source: "..."}; one without a source of its own takes the
file's `source`, and with neither it is refused.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from tacit.perf_model.dtypes import ACTIVATION_BYTES
from tacit.perf_model.efficiency import profile_names, register_profile
from tacit.perf_model.micro_batch_overlap import DEEPEP_NORMAL_SMS
from tacit.platforms.hardware_table import get_hardware_spec
from tacit.platforms.specs import HardwareSpec, Sourced, check_spec, with_threads

# key -> (unit scale to SI, required)
_FIGURES = {
    "memory_capacity_gb": (1e9, True),
    "memory_bandwidth_gb_s": (1e9, True),
    "link_bandwidth_gb_s": (1e9, True),
    "link_latency_us": (1e-6, True),
    "inter_node_bandwidth_gb_s": (1e9, False),
    "inter_node_latency_us": (1e-6, False),
    "sms": (1.0, False),
}
_OTHER = ("name", "description", "source", "flops_tflops", "devices_per_node", "graphs", "efficiency_profile", "cores")
FLOP_DTYPES = tuple(
    dict.fromkeys(("bf16", "fp16", "fp8", "int8", "fp4", *ACTIVATION_BYTES))
)  # the dtypes a GEMM multiplies in


def _read(path: Path) -> dict[str, Any]:
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"hardware file {path}: must end in .yaml, .yml or .json")
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"hardware file {path}: cannot be read ({e.strerror or e})") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError: both name the line
        raise ValueError(f"hardware file {path}: not valid {path.suffix[1:].upper()}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"hardware file {path}: must hold a mapping of fields, got {type(data).__name__}")
    return data


def _figure(path: Path, key: str, raw: Any, scale: float, file_source: str | None) -> Sourced:
    value, source = (raw.get("value"), raw.get("source")) if isinstance(raw, dict) else (raw, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"hardware file {path}: field {key!r} must be a positive number, got {value!r}")
    source = source or file_source
    if not source or not str(source).strip():
        raise ValueError(f"hardware file {path}: field {key!r} has no source (give it one, or a file-level 'source')")
    return Sourced(float(value) * scale, f"{source} (hardware file {path.name})")


def load_hardware_file(path: str | Path) -> HardwareSpec:
    """The HardwareSpec a hardware file describes; a bad file is a ValueError naming the file,
    the field and what is valid."""
    path = Path(path)
    d = _read(path)
    unknown = sorted(set(d) - set(_FIGURES) - set(_OTHER))
    if unknown:
        raise ValueError(f"hardware file {path}: unknown field(s) {unknown}; valid: {', '.join([*_OTHER, *_FIGURES])}")
    for key in ("name", "flops_tflops", "efficiency_profile", *(k for k, (_, req) in _FIGURES.items() if req)):
        if key not in d:
            raise ValueError(f"hardware file {path}: field {key!r} is missing")
    name, src = d["name"], d.get("source")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"hardware file {path}: field 'name' must be a non-empty string, got {name!r}")
    flops = d["flops_tflops"]
    if not isinstance(flops, dict) or "bf16" not in flops:
        raise ValueError(f"hardware file {path}: field 'flops_tflops' must map dtypes to TFLOP/s, bf16 among them")
    for dtype in flops:
        if dtype not in FLOP_DTYPES:
            raise ValueError(
                f"hardware file {path}: field 'flops_tflops' has unknown dtype {dtype!r}; valid: {', '.join(FLOP_DTYPES)}"
            )
    figs = {k: _figure(path, k, d[k], scale, src) for k, (scale, _) in _FIGURES.items() if k in d}
    if ("inter_node_bandwidth_gb_s" in figs) != ("inter_node_latency_us" in figs):
        raise ValueError(
            f"hardware file {path}: give both inter_node_bandwidth_gb_s and inter_node_latency_us, or neither"
        )
    per_node = d.get("devices_per_node", 1)
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise ValueError(f"hardware file {path}: field 'devices_per_node' must be an integer >= 1, got {per_node!r}")
    graphs = d.get("graphs", False)
    if not isinstance(graphs, bool):
        raise ValueError(f"hardware file {path}: field 'graphs' must be true or false, got {graphs!r}")
    cores = d.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ValueError(
            f"hardware file {path}: field 'cores' must be an integer >= 1 (a CPU's physical cores), got {cores!r}"
        )
    sms = figs.get("sms")
    if sms is not None and (not sms.value.is_integer() or sms.value <= DEEPEP_NORMAL_SMS):
        raise ValueError(
            f"hardware file {path}: field 'sms' must be a whole number of streaming multiprocessors above "
            f"{DEEPEP_NORMAL_SMS} (DeepEP's normal kernels hold {DEEPEP_NORMAL_SMS}), got {sms.value:g}"
        )
    spec = HardwareSpec(
        name=name,
        description=str(d.get("description", f"described by {path.name}")),
        flops={k: _figure(path, f"flops_tflops.{k}", v, 1e12, src) for k, v in flops.items()},
        memory_bandwidth=figs["memory_bandwidth_gb_s"],
        memory_capacity=figs["memory_capacity_gb"],
        link_bandwidth=figs["link_bandwidth_gb_s"],
        link_latency=figs["link_latency_us"],
        efficiency_profile=_profile_name(path, name, d["efficiency_profile"]),
        devices_per_node=per_node,
        inter_node_bandwidth=figs.get("inter_node_bandwidth_gb_s"),
        inter_node_latency=figs.get("inter_node_latency_us"),
        graphs=graphs,
        cores=cores,
        sms=sms,
    )
    return check_spec(spec)


def _profile_name(path: Path, name: str, profile: Any) -> str:
    """A named profile must exist; an inline one is registered for this process under the
    file's own name, so `predict()` loads it like any other."""
    if isinstance(profile, str):
        if profile not in profile_names():
            raise ValueError(
                f"hardware file {path}: efficiency_profile {profile!r} is not known; valid: {', '.join(profile_names())}"
            )
        return profile
    if not isinstance(profile, dict):
        raise ValueError(
            f"hardware file {path}: efficiency_profile must be a profile name or a mapping in efficiency.json's schema"
        )
    key = f"{name} ({path})"
    try:
        register_profile(key, {"source": f"inline in {path}", **profile})
    except ValueError as e:
        raise ValueError(f"hardware file {path}: field 'efficiency_profile': {e}") from None
    return key


def resolve_hardware(
    hardware: str | None,
    hardware_file: str | None,
    enforce_eager: bool = False,
    efficiency_profile: str | None = None,
    threads: int | None = None,
) -> HardwareSpec:
    """`--hardware NAME` or `--hardware-file FILE` (not both), with `--enforce-eager` turning
    graph capture off as vLLM's flag does, `--efficiency-profile NAME` pricing the part with
    another engine's profile than its own (llama.cpp on a Xeon whose entry is SGLang's), and
    `--threads N` a CPU's compute at N of its cores (with_threads)."""
    if hardware_file is not None and hardware not in (None, "this-cpu"):
        raise ValueError("give --hardware NAME or --hardware-file FILE, not both")
    spec = load_hardware_file(hardware_file) if hardware_file else get_hardware_spec(hardware or "this-cpu")
    if efficiency_profile is not None:
        if efficiency_profile not in profile_names():
            raise ValueError(
                f"--efficiency-profile {efficiency_profile!r} is not known; valid: {', '.join(profile_names())}"
            )
        spec = replace(spec, efficiency_profile=efficiency_profile)
    if threads is not None:
        spec = with_threads(spec, threads)
    return replace(spec, graphs=False) if enforce_eager else spec
