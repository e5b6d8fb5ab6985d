"""`tacit predict --html` (the predicted steps drawn as `tacit profile` draws measured ones) and
`tacit predict --validate --plot` (predicted against measured, one point per case)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tacit.cli import main
from tacit.profiler.categories import LABELS

# this-cpu pricing reads this machine's calibration: seeded, never fitted, in tests
pytestmark = pytest.mark.usefixtures("this_cpu_calibrated")


def _predict(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["predict", *argv]) == 0


def test_html_draws_both_steps_in_one_self_contained_file(tmp_path):
    out = tmp_path / "predict.html"
    _predict(["--model", "random:qwen3-moe-2b", "--hardware", "h100-sxm", "--batch-size", "4", "--html", str(out)])
    html = out.read_text()
    assert html.count("<svg") == 3  # the stacked bars, a roofline per step
    assert not re.search(r"""(src|href)=["']?(http|//|[a-z./])""", html)  # nothing fetched
    for label in ("GEMM", "attention", "MoE routing", "experts", "norms", "sampling", "Python/host"):
        assert f"prefill: {label}" in html and f"decode: {label}" in html  # a bar segment of each step
    for op_class in ("attn_proj", "attention", "moe_routing", "experts", "norm_elementwise", "lm_head", "sampling"):
        assert f"<td>{op_class}</td>" in html  # the per-operator tables
    assert f"<title>{LABELS['gemm']}: " in html  # a roofline point
    assert "h100-sxm" in html


def test_a_speculative_prediction_draws_its_verify_step(tmp_path):
    from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
    from tacit.perf_model.predict import Workload, predict
    from tacit.platforms.hardware_table import get_hardware_spec
    from tacit.profiler.predicted import categories_of

    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    plain = predict(shape, get_hardware_spec("h100-sxm"), Workload(1, 64, 32))
    assert plain.decode_step_s == plain.tpot_s
    spec = predict(shape, get_hardware_spec("h100-sxm"), Workload(1, 64, 32, speculative_tokens=3, acceptance=0.6))
    assert spec.decode_step_s > spec.tpot_s  # a verify step yields ~2.2 tokens
    # the bar is the whole step: its operators and the fixed cost the model adds to them
    assert sum(categories_of(spec.decode_ops, spec.decode_step_s).values()) == pytest.approx(spec.decode_step_s)
    out = tmp_path / "spec.html"
    _predict(["--model", "random:qwen3-100m", "--speculative-tokens", "3", "--acceptance", "0.6", "--html", str(out)])
    assert "verify: GEMM" in out.read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "random:qwen3-100m", "--plot", "x.png"], "--plot draws --validate's cases"),
        (["--serve", "--html", "x.html"], "--html draws one prediction's steps"),
    ],
)
def test_chart_flags_out_of_place_are_refused(argv, message, capsys):
    assert main(["predict", *argv]) == 2
    assert message in capsys.readouterr().err


def test_validate_plot_without_matplotlib_is_refused_before_measuring(no_matplotlib, monkeypatch, capsys):
    from tacit.perf_model import validate

    monkeypatch.setattr(validate, "run_validation", lambda *a: pytest.fail("measured before refusing --plot"))
    assert main(["predict", "--validate", "--plot", "out.png"]) == 2
    assert "--plot needs matplotlib: pip install -e '.[bench]'" in capsys.readouterr().err


def test_validate_plot_draws_the_rows(tmp_path):
    pytest.importorskip("matplotlib")
    from tacit.perf_model.validate import plot_validation

    rows = [
        {"decode_meas_ms": m, "decode_pred_ms": m * e, "prefill_meas_ms": 20 * m, "prefill_pred_ms": 20 * m / e}
        for m, e in ((1.2, 1.05), (3.4, 0.92), (9.0, 1.2))
    ]
    out = tmp_path / "validate.png"
    plot_validation(rows, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
