"""`tacit eval plot-kld`: KLD against bits per weight from several `tacit eval kld --json` files,
and the bits per weight those files record."""

import json

import pytest

from tacit.cli import main
from tacit.eval.kld_plot import load_points


def _result(path, kld: float, bits: float, peers: dict | None = None):
    path.write_text(json.dumps({"kld_mean": kld, "bits_per_weight": bits, "peers": peers or {}}))
    return str(path)


def test_one_labelled_point_per_file_and_peer(tmp_path):
    q4 = _result(tmp_path / "q4_1.json", 0.03, 5.0, {"llama.cpp": {"kld_mean": 0.05}})
    q8 = _result(tmp_path / "int8.json", 0.002, 8.5)
    assert load_points([q4, q8]) == [("q4_1", 5.0, 0.03), ("q4_1 (llama.cpp)", 5.0, 0.05), ("int8", 8.5, 0.002)]


def test_cli_writes_the_png(tmp_path):
    pytest.importorskip("matplotlib")
    files = [_result(tmp_path / f"{n}.json", k, b) for n, k, b in (("int4", 0.04, 5.0), ("int8", 0.003, 8.5))]
    out = tmp_path / "kld.png"
    assert main(["eval", "plot-kld", *files, "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "content, message",
    [
        ({"kld_mean": 0.01}, "has no bits_per_weight"),
        ({"bits_per_weight": 8.5}, "has no kld_mean"),
        ({"kld_mean": 0.0, "bits_per_weight": 16.0}, "a log axis cannot show it"),
    ],
)
def test_bad_result_files_are_refused_by_name(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=f"bad.json: .*{message}"):
        load_points([str(path)])
    with pytest.raises(FileNotFoundError, match="missing.json: no such file"):
        load_points([str(tmp_path / "missing.json")])


@pytest.mark.parametrize("quantization, low, high", [("auto", 32.0, 32.0), ("int8", 8.5, 32.0)])
def test_bits_per_weight_of_a_loaded_model(tiny_llama, quantization, low, high):
    """float32 weights are 32 bits; int8 linear layers are 8.5 (34 bytes per 32 values), and the
    lm_head kept unquantized pulls the mean above that."""
    from tacit.config.engine_args import EngineArgs
    from tacit.entrypoints.llm import LLM
    from tacit.profiler.roofline import model_shapes

    llm = LLM(engine_args=EngineArgs.from_kwargs(model=str(tiny_llama[2]), dtype="float32", quantization=quantization))
    bits = model_shapes(llm.engine.model).bits_per_weight
    assert low <= bits <= high and (low == high or low < bits < high)
