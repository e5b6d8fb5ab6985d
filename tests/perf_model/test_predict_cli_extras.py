"""`tacit predict --ops` (every operator's time) and `--model FILE.gguf` (the shape from a GGUF)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from tacit.cli import main
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf

WORKLOAD = Path(__file__).parents[2] / "docs" / "workloads" / "chat-2rps.jsonl"
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


def test_data_parallel_attention_splits_the_latent_cache():
    """DeepSeek-V3 at TP=8: with every device attending over 2 of 16 sequences, each holds an
    eighth of the latent cache and no attention all-reduce; the attention weights grow."""
    argv = ["predict", "--model", "DeepSeek-V3", "--hardware", "h200-sxm", "--tensor-parallel-size", "8"]
    argv += ["--expert-parallel", "--quantization", "fp8", "--batch-size", "16", "--input-len", "32768"]
    argv += ["--output-len", "2", "--ops"]

    def memory(out: str) -> tuple[float, float]:
        m = re.search(r"weights ([\d.]+), KV ([\d.]+)", out)
        return float(m.group(1)), float(m.group(2))

    tp, dp = _run(argv), _run(argv + ["--data-parallel-attention"])
    (w_tp, kv_tp), (w_dp, kv_dp) = memory(tp), memory(dp)
    assert kv_dp == pytest.approx(kv_tp / 8, rel=0.01) and w_dp > w_tp
    assert "DP-attention" in dp and "mlp_all_gather" in dp and "all_reduce " not in dp


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tensor-parallel-size", "1"], "needs --tensor-parallel-size >= 2"),
        (
            ["--tensor-parallel-size", "2", "--serve", "--workload", str(WORKLOAD)],
            "--serve does not model --data-parallel-attention",
        ),
    ],
)
def test_data_parallel_attention_refusals(extra, message, capsys):
    argv = ["predict", "--model", "DeepSeek-V3", "--hardware", "h200-sxm", "--data-parallel-attention"]
    assert main(argv + extra) == 2
    assert message in capsys.readouterr().err
