"""The hardware table: every entry sourced, with the node fields and a profile of its family that
loads; the per-chip and per-die entries are the card's and package's figures divided."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tacit.perf_model.efficiency import DATA, load_profile, profile_entry
from tacit.platforms.hardware_table import TABLE, get_hardware_spec, hardware_names
from tacit.platforms.specs import check_spec

PLATFORMS = Path(__file__).resolve().parents[2] / "tacit" / "platforms"
GPUS = ("a100-80g", "h100-sxm", "h200-sxm", "b200", "l40s", "mi300x")
CPUS = ("xeon-6980p", "xeon-6980p-ddr5", "xeon-6972p", "xeon-6960p", "xeon-8592plus", "xeon-8480plus")
CPUS += ("epyc-9654", "epyc-9175f", "epyc-9965")


def test_the_issues_parts_are_in_the_table():
    for name in (*GPUS, *CPUS, "ascend-910b", "ascend-910c", "ascend-910c-die", "ascend-310p", "atlas-300i-duo"):
        assert name in hardware_names()


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_entry_is_sourced_has_node_fields_and_a_family_profile_that_loads(name):
    spec = check_spec(get_hardware_spec(name))
    assert spec.devices_per_node >= 1
    assert spec.inter_node_bandwidth is not None and spec.inter_node_latency is not None
    profile = load_profile(spec.efficiency_profile)
    assert profile.name not in ("this-cpu", "accelerator")  # no entry borrows this machine's fit
    for key, v in spec.sourced_fields().items():
        # an estimate says so at the start of its source, and why after the colon
        if "estimate" in v.source.lower():
            assert "estimate:" in v.source, (name, key, v.source)
    if spec.graphs:
        assert profile.graph_op_overhead_s is not None, f"{name} captures graphs but its profile has no graph figures"


def test_node_shapes_by_kind():
    for name in GPUS:
        spec = get_hardware_spec(name)
        assert spec.graphs and spec.devices_per_node == 8
        assert spec.inter_node_bandwidth.value < spec.link_bandwidth.value  # the NIC is the slow link
    for name in CPUS:
        spec = get_hardware_spec(name)
        assert not spec.graphs and spec.devices_per_node == 2  # two sockets, UPI / xGMI between them
    assert get_hardware_spec("h100-sxm").inter_node_bandwidth.value == 50e9  # ConnectX-7 400 Gb/s per GPU
    assert get_hardware_spec("ascend-910c").devices_per_node == 384  # one UB domain, CloudMatrix 384


def test_per_chip_and_per_die_entries_divide_the_card_and_the_package():
    duo = get_hardware_spec("atlas-300i-duo")
    assert duo.peak_flops("int8") == 140e12 and duo.memory_capacity.value == 48e9  # 280 TOPS, 96 GB a card
    assert duo.memory_bandwidth.value == 204e9  # 408 GB/s a card
    pkg, die = get_hardware_spec("ascend-910c"), get_hardware_spec("ascend-910c-die")
    for f in ("bf16", "int8"):
        assert pkg.peak_flops(f) == 2 * die.peak_flops(f)
    assert pkg.peak_flops("bf16") == 752e12
    for field in ("memory_bandwidth", "memory_capacity", "link_bandwidth"):
        assert getattr(pkg, field).value == 2 * getattr(die, field).value


def test_cpu_rates_follow_the_matrix_unit_per_cycle():
    # AMX: 1024 BF16 FLOP a cycle a core at base clock; Zen 4 half the Zen 5 rate per cycle
    assert get_hardware_spec("xeon-6980p").peak_flops("bf16") == 128 * 1024 * 2.0e9
    assert get_hardware_spec("xeon-6980p").memory_bandwidth.value == 12 * 8800 * 8e6  # MRDIMM-8800
    assert get_hardware_spec("epyc-9654").peak_flops("bf16") == pytest.approx(96 * 64 * 2.4e9)
    assert get_hardware_spec("epyc-9965").peak_flops("bf16") == pytest.approx(192 * 128 * 2.25e9)


def test_an_entry_without_a_profile_is_refused():
    with pytest.raises(ValueError, match="efficiency_profile is empty"):
        check_spec(replace(get_hardware_spec("l40s"), efficiency_profile=" "))


def test_family_profiles_say_where_each_figure_comes_from():
    profiles = json.loads(DATA.read_text())
    assert "accelerator" not in profiles and "cpu" not in profiles
    for name in profiles:
        d = profile_entry(name)  # a same_as profile: its base's figures, with its own over them
        assert d["source"].strip()
        if "fitted_at" in d:  # a fit made on a named part: its source names the command, and its date
            assert "python -m tacit.perf_model.fit" in d["source"] and d["fitted_at"].strip()
            continue
        for key in ("gemm.bandwidth_fraction", "gemm.compute_fraction", "op_overhead_s"):
            assert d["figures"][key].strip(), (name, key)
        if name.startswith("granite-rapids") or name in ("sapphire-rapids", "epyc-zen4", "epyc-zen5"):
            assert d["engine"].strip()  # whose kernels (SGLang's CPU backend, llama.cpp) the figures describe


def test_the_table_files_stay_small():
    for f in ("hardware_table.py", "hw_gpus.py", "hw_ascend.py", "hw_cpus.py"):
        assert len((PLATFORMS / f).read_text().splitlines()) <= 400, f
