"""`tacit predict --ops` (every operator's time) and `--model FILE.gguf` (the shape from a GGUF)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from tacit.cli import main
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf

# this-cpu pricing reads this machine's calibration: seeded, never fitted, in tests
pytestmark = pytest.mark.usefixtures("this_cpu_calibrated")

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
    assert "moe_all_reduce" in out and "link-bound" in out


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


def test_a_prefix_hit_rate_prefills_only_the_uncached_tokens():
    """--prefix-hit-rate 0.9 of a 2,000-token prompt: 200 tokens prefilled over 1,800 cached, the
    same step the operator model prices for that shape; TPOT and memory do not move."""
    from tacit.perf_model.calibration import profile_for
    from tacit.perf_model.operators import StepShape
    from tacit.perf_model.predict import Workload, fitted_roofs, predict, step_time
    from tacit.platforms.hardware_table import get_hardware_spec

    shape = shape_from_hf(load_hf_config("random:qwen3-moe-2b"))
    spec = get_hardware_spec("this-cpu")
    cold = predict(shape, spec, Workload(1, 2000, 64))
    warm = predict(shape, spec, Workload(1, 2000, 64, prefix_hit_rate=0.9))
    assert warm.ttft_s < cold.ttft_s and warm.tpot_s == cold.tpot_s and warm.memory == cold.memory
    w = Workload(1, 2000, 64)
    profile = profile_for(spec)
    direct, _ = step_time(shape, fitted_roofs(spec, profile), profile, w, StepShape(1, 200, 1800))
    assert warm.ttft_s == pytest.approx(direct)
    with pytest.raises(ValueError, match=r"prefix_hit_rate=1.0 is invalid: must be in \[0, 1\)"):
        Workload(1, 10, 10, prefix_hit_rate=1.0)
    out = _run(["predict", "--model", "random:qwen3-moe-2b", "--input-len", "2000", "--prefix-hit-rate", "0.9"])
    assert "input 2000 (1800 cached)" in out


def test_speculative_decoding_divides_a_verify_step_by_the_tokens_it_yields():
    """k drafts at acceptance a: a verify step is the decode step of batch * (k + 1) rows (plus
    the MTP layer's forwards and the head for MTP), yielding 1 + a + ... + a^k tokens a
    sequence."""
    from tacit.perf_model.calibration import profile_for
    from tacit.perf_model.operators import StepShape
    from tacit.perf_model.predict import Workload, fitted_roofs, predict, step_time
    from tacit.platforms.hardware_table import get_hardware_spec

    shape = shape_from_hf(load_hf_config("random:deepseek-v3-1b"))
    spec = get_hardware_spec("this-cpu")
    plain = predict(shape, spec, Workload(1, 512, 64))
    head = sum(t.seconds for t in plain.decode_ops if t.op.op_class == "lm_head")
    assert 0 < head < plain.tpot_s
    w = Workload(1, 512, 64, speculative_tokens=2, acceptance=0.8)
    assert w.tokens_per_verify == pytest.approx(1 + 0.8 + 0.64)
    lookup = predict(shape, spec, w)
    profile = profile_for(spec)
    verify, _ = step_time(shape, fitted_roofs(spec, profile), profile, w, StepShape(3, 1, round(512 + 31)))
    assert lookup.tpot_s == pytest.approx(verify / 2.44)
    mtp = predict(shape, spec, Workload(1, 512, 64, speculative_tokens=2, acceptance=0.8, speculative_method="mtp"))
    # The verify step reads the weights once for its 3 rows: cheaper than 3 plain steps on any
    # host. Whether it beats one plain step at 2.44 tokens depends on this machine's measured
    # FLOP/byte (its seeded fit's roofs): under load a 3-row fp32 step here turned compute-bound
    # and read 44.9 ms a token against 35.9, so that is not asserted.
    assert verify < 3 * plain.decode_step_s and lookup.tpot_s < mtp.tpot_s
    # the drafts' own pricing: test_predict_workload.py's MTP-layer test
    assert mtp.draft_s > 0 and mtp.tpot_s == pytest.approx((verify + mtp.draft_s) / 2.44)
    assert lookup.ttft_s == plain.ttft_s
    for bad, message in (
        ({"acceptance": 1.0}, r"acceptance=1.0 is invalid"),
        ({"speculative_tokens": -1}, "speculative_tokens=-1 is invalid"),
        ({"speculative_method": "eagle"}, "speculative_method='eagle' is not known"),
    ):
        with pytest.raises(ValueError, match=message):
            Workload(1, 10, 10, **bad)
    out = _run(
        ["predict", "--model", "random:deepseek-v3-1b", "--speculative-tokens", "2", "--acceptance", "0.8",
         "--speculative-method", "mtp"]
    )  # fmt: skip
    assert "mtp drafts 2 a step at acceptance 0.8 (2.44 tokens a verify)" in out


def test_no_chunked_prefill_budgets_the_models_length_as_the_engine_does(tmp_path):
    """Without chunked prefill the engine raises the step budget to the model's max_model_len
    (Llama-3.1-8B: 131,072): a batch of 32 x 400-token prompts prefills in one step, where the
    accelerator default of 8,192 tokens a step (which the longest prompt did not raise) took two."""
    import json

    argv = ["predict", "--model", "Llama-3.1-8B", "--hardware", "h200-sxm", "--batch-size", "32"]
    argv += ["--input-len", "400", "--output-len", "8", "--json", str(tmp_path / "p.json")]
    _run(argv)
    chunked = json.loads((tmp_path / "p.json").read_text())["ttft"]
    _run([*argv, "--no-chunked-prefill"])
    whole = json.loads((tmp_path / "p.json").read_text())["ttft"]
    assert (chunked["prefill_steps"], chunked["max_num_batched_tokens"]) == (2, 8192)
    assert (whole["prefill_steps"], whole["max_num_batched_tokens"]) == (1, 131072)
    assert whole["mean"] == pytest.approx(whole["max"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--published", "--batch-size", "4"], "--batch-size does not go with --published"),
        (["--published", "--model", "Llama-3.1-8B"], "--model does not go with --published"),
        (["--validate", "--model", "Llama-3.1-8B"], "--model does not go with --validate"),
        (["--validate", "--hardware", "h100-sxm"], "--hardware does not go with --validate"),
        (["--validate", "--quantization", "int8"], "--quantization does not go with --validate"),
    ],
)
def test_a_mode_refuses_one_predictions_flags_it_would_ignore(argv, message, capsys, monkeypatch):
    """--published runs each figure's own command and --validate its own cases: a flag of one
    prediction given with them is named, before anything runs, not dropped."""
    from tacit.perf_model import published, validate

    monkeypatch.setattr(validate, "run_validation", lambda *a, **k: pytest.fail("measured before refusing"))
    monkeypatch.setattr(published, "run_published", lambda *a, **k: pytest.fail("ran before refusing"))
    assert main(["predict", *argv]) == 2
    assert message in capsys.readouterr().err
