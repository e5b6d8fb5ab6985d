"""`tacit predict --ops` (every operator's time) and `--model FILE.gguf` (the shape from a GGUF)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from tacit.cli import main
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf

DEFAULT_GGUF = Path.home() / ".cache" / "tacit" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _run(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


def test_ops_rows_sum_to_the_operator_total():
    out = _run(
        ["predict", "--model", "Qwen3-30B-A3B", "--hardware", "h200-sxm", "--tensor-parallel-size", "4"]
        + ["--expert-parallel", "--ops"]
    )
    blocks = re.split(r"^  (?:prefill|decode) operators", out, flags=re.M)[1:]
    assert len(blocks) == 2
    for block in blocks:
        total = float(re.search(r"operators ([\d.]+),", block).group(1))
        rows = [float(m.group(1)) for m in re.finditer(r"^    \w+\s+\w+\s+([\d.]+)\s", block, re.M)]
        assert len(rows) > 5 and sum(rows) == pytest.approx(total, abs=0.01 * len(rows))
    assert "moe_all_to_all" in out and "link-bound" in out


@pytest.mark.skipif(not DEFAULT_GGUF.is_file(), reason="the default model's GGUF is not cached here")
def test_gguf_model_gives_its_shape():
    s = shape_from_hf(load_hf_config(str(DEFAULT_GGUF)))
    assert (s.num_layers, s.hidden_size, s.num_kv_heads, s.intermediate_size) == (30, 576, 3, 1536)
