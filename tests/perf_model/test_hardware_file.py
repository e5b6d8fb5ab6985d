"""`--hardware-file` (YAML and JSON round trips, every bad input named) and `--enforce-eager`
(a graphs part's decode step pays the launches the graph replay saved)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tacit.perf_model.efficiency import load_profile
from tacit.perf_model.hardware_file import load_hardware_file, resolve_hardware
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.predict import Workload, predict
from tacit.platforms.hardware_table import get_hardware_spec
from tacit.platforms.specs import HardwareSpec
from tests.perf_model.test_counts import DENSE, MOE

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hardware" / "epyc-9554-two-socket.yaml"


def _as_file(spec: HardwareSpec) -> dict:
    """A table entry written as a hardware file, each figure with its own source."""

    def fig(v, scale):
        return {"value": v.value / scale, "source": v.source}

    return {
        "name": spec.name + "-file",
        "description": spec.description,
        "flops_tflops": {k: fig(v, 1e12) for k, v in spec.flops.items()},
        "memory_capacity_gb": fig(spec.memory_capacity, 1e9),
        "memory_bandwidth_gb_s": fig(spec.memory_bandwidth, 1e9),
        "link_bandwidth_gb_s": fig(spec.link_bandwidth, 1e9),
        "link_latency_us": fig(spec.link_latency, 1e-6),
        "inter_node_bandwidth_gb_s": fig(spec.inter_node_bandwidth, 1e9),
        "inter_node_latency_us": fig(spec.inter_node_latency, 1e-6),
        "devices_per_node": spec.devices_per_node,
        "graphs": spec.graphs,
        "efficiency_profile": spec.efficiency_profile,
        **({"cores": spec.cores} if spec.cores is not None else {}),
        **({"sms": fig(spec.sms, 1)} if spec.sms is not None else {}),
    }


def _write(tmp_path: Path, d: dict, suffix: str = ".yaml") -> Path:
    p = tmp_path / f"hw{suffix}"
    p.write_text(json.dumps(d) if suffix == ".json" else yaml.safe_dump(d))
    return p


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("name", ["h100-sxm", "epyc-9654", "ascend-910c"])
def test_a_table_entry_round_trips_through_a_file(tmp_path, suffix, name):
    spec = get_hardware_spec(name)
    loaded = load_hardware_file(_write(tmp_path, _as_file(spec), suffix))
    for field in ("devices_per_node", "graphs", "efficiency_profile", "cores"):
        assert getattr(loaded, field) == getattr(spec, field), field
    assert loaded.sourced_fields().keys() == spec.sourced_fields().keys()
    for key, v in spec.sourced_fields().items():
        got = loaded.sourced_fields()[key]
        assert got.value == pytest.approx(v.value, rel=1e-12) and got.source.startswith(v.source), key


def test_the_example_file_predicts_through_the_cli(tmp_path):
    from tacit.cli import main

    spec = load_hardware_file(EXAMPLE)
    assert spec.devices_per_node == 2 and not spec.graphs and spec.efficiency_profile == "epyc-zen4"
    assert "file-level" not in spec.flops["bf16"].source  # figures carry their own sources
    out = tmp_path / "p.json"
    argv = ["predict", "--model", "random:qwen3-100m", "--hardware-file", str(EXAMPLE), "--json", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["tpot_ms"] > 0
    assert (
        main(["predict", "--model", "random:qwen3-100m", "--hardware", "h100-sxm", "--hardware-file", str(EXAMPLE)])
        == 2
    )


def test_an_inline_profile_is_what_predict_uses(tmp_path):
    base = _as_file(get_hardware_spec("h100-sxm"))
    inline = {
        "gemm": {"bf16": {"rows": [1, 512], "eff": [0.5, 0.5]}},
        "attention_decode": 0.5,
        "attention_prefill": 0.5,
        "elementwise": 0.5,
        "op_overhead_s": 0.0,
        "step_overhead_s": {"decode_fused": 0.0, "torch": 0.0},
        "layer_overhead_s": {"decode_fused": 0.0, "torch": 0.0},
    }
    flat = {k: {"rows": [1], "eff": [1.0]} for k in ("bf16",)}
    full_d = {**inline, "gemm": flat, "attention_decode": 1.0, "attention_prefill": 1.0, "elementwise": 1.0}
    half = load_hardware_file(_write(tmp_path, {**base, "graphs": False, "efficiency_profile": inline}))
    full = load_hardware_file(
        _write(tmp_path, {**base, "name": "full", "graphs": False, "efficiency_profile": full_d}, ".json")
    )
    assert load_profile(half.efficiency_profile).gemm_efficiency("bf16", 1) == 0.5
    w, shape = Workload(1, 64, 16), shape_from_hf(DENSE)
    # decode at half the efficiency in every operator and no fixed costs: twice the step
    assert predict(shape, half, w).tpot_s == pytest.approx(2 * predict(shape, full, w).tpot_s, rel=1e-6)


def test_an_inline_profile_may_borrow_a_shipped_one_and_state_what_differs(tmp_path):
    base = _as_file(get_hardware_spec("xeon-6980p"))
    inline = {"same_as": "granite-rapids", "gemm_compute": {"int8": 0.04375}}
    spec = load_hardware_file(_write(tmp_path, {**base, "efficiency_profile": inline}))
    borrowed, shipped = load_profile(spec.efficiency_profile), load_profile("granite-rapids-sglang-vnni")
    assert borrowed.gemm_compute == shipped.gemm_compute and borrowed.gemm == shipped.gemm
    assert borrowed.op_overhead_s == shipped.op_overhead_s
    w, shape = Workload(1, 512, 2, "w8a8_int8"), shape_from_hf(DENSE)
    assert predict(shape, spec, w).ttft_s == pytest.approx(predict(shape, spec, w, shipped).ttft_s)


def _good() -> dict:
    return _as_file(get_hardware_spec("epyc-9654"))


BAD = [
    ("missing field", lambda d: d.pop("memory_bandwidth_gb_s"), "field 'memory_bandwidth_gb_s' is missing"),
    (
        "non-positive",
        lambda d: d.update(link_bandwidth_gb_s=0),
        "field 'link_bandwidth_gb_s' must be a positive number",
    ),
    ("negative flops", lambda d: d["flops_tflops"].update(bf16=-1), r"field 'flops_tflops.bf16' must be a positive"),
    ("unknown dtype", lambda d: d["flops_tflops"].update(fp3=1), r"unknown dtype 'fp3'; valid: bf16, fp16, fp8, int8"),
    ("no bf16", lambda d: d["flops_tflops"].pop("bf16"), "bf16 among them"),
    (
        "unknown profile",
        lambda d: d.update(efficiency_profile="tpu-v9"),
        r"efficiency_profile 'tpu-v9' is not known; valid: .*epyc-zen4",
    ),
    (
        "inline lacks",
        lambda d: d.update(efficiency_profile={"attention_decode": 0.5}),
        "efficiency_profile.*lacks 'gemm'",
    ),
    (
        "inline same_as unknown",
        lambda d: d.update(efficiency_profile={"same_as": "tpu-v9"}),
        r"efficiency_profile.*same_as 'tpu-v9' is not a shipped profile; valid: .*granite-rapids",
    ),
    ("no source", lambda d: d.update(memory_capacity_gb=512), "field 'memory_capacity_gb' has no source"),
    ("unknown field", lambda d: d.update(memory_gb=1), r"unknown field\(s\) \['memory_gb'\]; valid: name"),
    (
        "half inter-node",
        lambda d: d.pop("inter_node_latency_us"),
        "both inter_node_bandwidth_gb_s and inter_node_latency_us",
    ),
    ("devices", lambda d: d.update(devices_per_node=0), "'devices_per_node' must be an integer >= 1"),
    ("graphs", lambda d: d.update(graphs="yes"), "'graphs' must be true or false"),
    ("cores", lambda d: d.update(cores=0), r"'cores' must be an integer >= 1 \(a CPU's physical cores\), got 0"),
    ("fractional cores", lambda d: d.update(cores=9.5), "'cores' must be an integer >= 1"),
    (
        "sms",
        lambda d: d.update(sms={"value": 16, "source": "a small GPU"}),
        r"'sms' must be a whole number of streaming multiprocessors above 20 \(DeepEP's normal kernels hold 20\)",
    ),
    ("fractional sms", lambda d: d.update(sms={"value": 131.5, "source": "x"}), r"'sms' must be a whole .* got 131.5"),
]


@pytest.mark.parametrize("case,edit,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_file_the_field_and_what_is_valid(tmp_path, case, edit, message):
    d = _good()
    edit(d)
    path = _write(tmp_path, d)
    with pytest.raises(ValueError, match=message) as e:
        load_hardware_file(path)
    assert str(path) in str(e.value)


def test_unreadable_and_malformed_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"nope\.yaml: cannot be read"):
        load_hardware_file(tmp_path / "nope.yaml")
    with pytest.raises(ValueError, match=r"must end in \.yaml, \.yml or \.json"):
        load_hardware_file(tmp_path / "hw.toml")
    bad = tmp_path / "hw.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"hw\.json: not valid JSON"):
        load_hardware_file(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        load_hardware_file(listed)


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_enforce_eager_adds_the_launches_the_graph_replay_saved(cfg):
    spec = get_hardware_spec("h100-sxm")
    assert spec.graphs
    shape, w = shape_from_hf(cfg), Workload(4, 256, 32)
    graphed, eager = predict(shape, spec, w), predict(shape, resolve_hardware("h100-sxm", None, enforce_eager=True), w)
    p = load_profile(spec.efficiency_profile)
    launches = sum(t.op.launches for t in graphed.decode_ops)
    saved = launches * (p.op_overhead_s - p.graph_op_overhead_s) - p.graph_step_overhead_s
    assert saved > 0
    assert eager.decode_step_s - graphed.decode_step_s == pytest.approx(saved, rel=1e-9)
    assert eager.ttft_s == pytest.approx(graphed.ttft_s)  # prefill runs eagerly either way


def test_enforce_eager_changes_nothing_on_a_part_without_graphs():
    shape, w = shape_from_hf(DENSE), Workload(1, 64, 16)
    spec = get_hardware_spec("xeon-6980p")
    assert predict(shape, spec, w).tpot_s == predict(shape, resolve_hardware("xeon-6980p", None, True), w).tpot_s
