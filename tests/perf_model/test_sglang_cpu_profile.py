"""granite-rapids-sglang-vnni: SGLang's CPU backend before its PR 8750, whose w8a8 int8 GEMMs ran
AVX-512 VNNI, not AMX. A `same_as` profile states only what differs from the one it borrows; here
that is the int8 GEMMs' compute unit, so int8 prompts slow down and nothing else moves."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tacit.perf_model.efficiency import DATA, load_profile, profile_entry

VNNI = "granite-rapids-sglang-vnni"
# int8 operations a cycle a core: AMX's, which the table's int8 peak counts (hw_cpus._amx), and
# AVX-512 VNNI's, two 512-bit VPDPBUSD a cycle of 64 multiply-adds (two operations) each
AMX_INT8_OPS = 2048
VNNI_INT8_OPS = 2 * 64 * 2


def test_the_profile_differs_from_granite_rapids_only_in_the_int8_compute_unit():
    amx, vnni = load_profile("granite-rapids"), load_profile(VNNI)
    differ = {f.name for f in dataclasses.fields(amx) if getattr(amx, f.name) != getattr(vnni, f.name)}
    assert differ == {"name", "source", "gemm_compute"}
    # the same kernel fraction of the unit the code ran: the AMX curve's large-M end, scaled by the units
    large_m = amx.gemm["int8"].eff[-1]
    assert vnni.gemm_compute == {"int8": pytest.approx(large_m * VNNI_INT8_OPS / AMX_INT8_OPS)}


def test_a_same_as_entry_states_only_what_differs_and_borrows_the_rest():
    raw = json.loads(DATA.read_text())[VNNI]
    assert raw["same_as"] == "granite-rapids" and "gemm" not in raw and "op_overhead_s" not in raw
    entry, base = profile_entry(VNNI), profile_entry("granite-rapids")
    assert entry["gemm"] == base["gemm"] and entry["engine"] != base["engine"]
    # its own figure over the base's, the base's other figures kept
    assert entry["figures"]["gemm.compute_fraction"].startswith("int8 0.04375")
    assert entry["figures"]["gemm.bandwidth_fraction"] == base["figures"]["gemm.bandwidth_fraction"]


def _predict(tmp_path, quantization: str, profile: str | None) -> dict:
    from tacit.cli import main

    out = tmp_path / "p.json"
    argv = ["predict", "--model", "Qwen3-235B-A22B", "--hardware", "xeon-6980p", "--tensor-parallel-size", "2"]
    argv += ["--quantization", quantization, "--batch-size", "1", "--input-len", "1024", "--output-len", "64"]
    argv += ["--efficiency-profile", profile] if profile else []
    assert main([*argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_int8_prompts_slow_down_and_decode_and_bf16_do_not(tmp_path):
    amx, vnni = _predict(tmp_path, "w8a8_int8", None), _predict(tmp_path, "w8a8_int8", VNNI)
    # decode reads weights at the same bandwidth fraction: VNNI is fast enough for one row
    assert vnni["tpot_ms"] == pytest.approx(amx["tpot_ms"])
    # a 1024-token prompt's GEMMs compute-bound at 1/8 the rate: slower, never more than the units' 8x
    assert 1.5 * amx["ttft_ms"] < vnni["ttft_ms"] < AMX_INT8_OPS / VNNI_INT8_OPS * amx["ttft_ms"]
    bf16 = _predict(tmp_path, "bf16", None), _predict(tmp_path, "bf16", VNNI)
    assert bf16[1]["ttft_ms"] == pytest.approx(bf16[0]["ttft_ms"])  # bf16 stays on AMX
