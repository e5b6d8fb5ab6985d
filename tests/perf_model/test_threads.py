"""`tacit predict --threads N`: a CPU's compute priced at min(N, cores) of its cores, its memory
bandwidth left as the profile measured it; refused, by name, where there are no cores to count."""

from __future__ import annotations

import json

import pytest

from tacit.perf_model.hardware_file import load_hardware_file, resolve_hardware
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.predict import Workload, predict
from tacit.platforms.hardware_table import get_hardware_spec, hardware_names
from tacit.platforms.specs import with_threads
from tests.perf_model.test_counts import MOE
from tests.perf_model.test_hardware_file import EXAMPLE

# (bf16 FLOP a cycle a core) of the units the table's CPU entries are priced by (hw_cpus.py)
PER_CYCLE = {"xeon": 1024, "epyc-9654": 64, "epyc-9175f": 128, "epyc-9965": 128}


def _cpu_names() -> list[str]:
    return [n for n in hardware_names() if n != "this-cpu" and get_hardware_spec(n).cores is not None]


def test_every_cpu_of_the_table_states_the_cores_its_flops_count():
    names = _cpu_names()
    assert {"xeon-6980p", "epyc-9654", "epyc-9965"} <= set(names)
    for name in names:
        spec = get_hardware_spec(name)
        per_cycle = next(v for k, v in PER_CYCLE.items() if name.startswith(k))
        ghz = spec.flops["bf16"].value / (spec.cores * per_cycle * 1e9)
        assert 1.5 < ghz < 4.5, (name, ghz)  # a base clock: the cores and the flops agree
        assert f"{spec.cores} cores" in spec.flops["bf16"].source
    assert get_hardware_spec("h100-sxm").cores is None and get_hardware_spec("ascend-910c").cores is None


@pytest.mark.parametrize("threads,share", [(64, 0.5), (128, 1.0), (256, 1.0), (1, 1 / 128)])
def test_compute_scales_with_the_cores_used_and_bandwidth_does_not(threads, share):
    spec = get_hardware_spec("xeon-6980p")
    t = with_threads(spec, threads)
    for dtype, v in spec.flops.items():
        assert t.flops[dtype].value == pytest.approx(v.value * share, rel=1e-12)
        assert f"--threads {threads}" in t.flops[dtype].source
    assert t.memory_bandwidth == spec.memory_bandwidth and t.memory_capacity == spec.memory_capacity
    assert f"{threads} threads" in t.description
    assert ("past the cores" in t.description) == (threads > spec.cores)


@pytest.mark.parametrize("model", ["moe", "Llama-3.1-8B"])
def test_half_the_threads_double_a_compute_bound_prefill_and_leave_a_memory_bound_decode(model):
    shape = shape_from_hf(MOE if model == "moe" else load_hf_config(model))
    w = Workload(1, 2048, 8)
    full = predict(shape, get_hardware_spec("xeon-6980p"), w)
    half = predict(shape, resolve_hardware("xeon-6980p", None, threads=64), w)
    full_ops = {t.op.name: t for t in full.prefill_ops}
    compute_bound = [t for t in half.prefill_ops if t.compute_s > t.memory_s and t.op.op_class != "communication"]
    assert compute_bound
    for t in compute_bound:
        assert t.compute_s == pytest.approx(2 * full_ops[t.op.name].compute_s, rel=1e-9), t.op.name
    for a, b in zip(full.decode_ops, half.decode_ops, strict=True):
        assert b.memory_s == a.memory_s and b.compute_s == pytest.approx(2 * a.compute_s, rel=1e-9)
    if model != "moe":  # the tiny MoE's prefill is its fixed costs; an 8B's is its GEMMs
        assert half.ttft_s > 1.8 * full.ttft_s
    memory_bound = all(t.memory_s >= 2 * t.compute_s for t in full.decode_ops if t.op.op_class != "communication")
    assert memory_bound and half.tpot_s == pytest.approx(full.tpot_s, rel=1e-9)


def test_a_hardware_file_states_its_cores_and_threads_use_them():
    spec = load_hardware_file(EXAMPLE)
    assert spec.cores == 64
    assert with_threads(spec, 16).flops["bf16"].value == pytest.approx(spec.flops["bf16"].value / 4)


@pytest.mark.parametrize(
    "hardware,threads,message",
    [
        ("h100-sxm", 8, r"--threads prices a CPU's compute by its cores; hardware 'h100-sxm' states none"),
        ("xeon-6980p", 0, r"--threads must be an integer >= 1, got 0"),
        ("xeon-6980p", -4, r"--threads must be an integer >= 1, got -4"),
    ],
)
def test_threads_are_refused_where_they_mean_nothing(hardware, threads, message):
    with pytest.raises(ValueError, match=message):
        resolve_hardware(hardware, None, threads=threads)


def test_the_cli_takes_threads_and_echoes_them(tmp_path, capsys):
    from tacit.cli import main

    out = tmp_path / "p.json"
    base = ["predict", "--model", "random:qwen3-100m", "--hardware", "epyc-9654", "--input-len", "512"]
    assert main([*base, "--threads", "48", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["inputs"]["threads"] == 48 and data["hardware"]["cores"] == 96
    assert "48 threads (48 of 96 cores' compute)" in capsys.readouterr().out
    assert main([*base, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["ttft_ms"] < data["ttft_ms"]
    assert main(["predict", "--published", "--threads", "8"]) == 2
    assert "--threads prices one prediction" in capsys.readouterr().err
