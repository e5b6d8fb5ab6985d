"""Under --tensor-parallel-size 2 the report's communication section is filled from
ModelRunner.communication_seconds(): per layer, rank 0's seconds blocked in collectives; and
per rank, each rank's step time and the part of it blocked (Executor.rank_stats)."""

import json

import pytest

from tacit.cli import main
from tacit.kernels.cpu_kernels import load_cpu_kernels


# bf16 decodes on the fused C++ step (its all-reduces); float32 runs every step on the torch path.
@pytest.mark.parametrize(
    "dtype",
    ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(load_cpu_kernels() is None, reason="no fused step"))],
)
def test_tp2_fills_the_communication_section(tiny_llama, tmp_path, dtype):
    _, _, path = tiny_llama
    args = ["profile", "--model", str(path), "--dtype", dtype, "--tensor-parallel-size", "2", "--no-measure-hw"]
    args += ["--batch-size", "2", "--input-len", "8", "--output-len", "4", "--repeats", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    p = json.loads((tmp_path / "profile.json").read_text())
    assert p["engine"]["tensor_parallel_size"] == 2
    assert {"layers.0", "layers.1"} <= set(p["communication"]) and all(s > 0 for s in p["communication"].values())
    for kind in ("prefill", "decode"):
        k = p["kinds"][kind]
        assert k["categories"]["communication"]["mean"] > 0
        assert sum(st["mean"] for st in k["categories"].values()) == pytest.approx(k["step_s"]["mean"], rel=0.03)
        assert k["categories"]["host"]["p10"] >= 0
    html = (tmp_path / "report.html").read_text()
    assert "No communication" not in html and "blocked in collectives" in html
    # every rank's own totals over the profiled steps, gathered from the worker too
    assert [r["rank"] for r in p["ranks"]] == [0, 1]
    for r in p["ranks"]:
        assert r["execute_s"] > r["communication_s"] > 0
    assert "blocked share" in html
