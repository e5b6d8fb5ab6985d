"""Corrupt safetensors shards and GGUF files are refused in seconds with one line naming the file
and the field, before the model is allocated, through LLM(...) and through the CLI."""

import json
import shutil
import struct
import subprocess
import sys
import time

import pytest

from tacit import LLM
from tacit.loader.gguf_writer import export_hf_to_gguf


def rewrite_safetensors(src_dir, dst_dir, edit):
    """Copy an HF directory, then edit(header, data) -> (header, data) or raw bytes."""
    shutil.copytree(src_dir, dst_dir)
    f = dst_dir / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    out = edit(json.loads(raw[8 : 8 + n]), raw[8 + n :])
    if isinstance(out, tuple):
        header = json.dumps(out[0]).encode()
        out = struct.pack("<Q", len(header)) + header + out[1]
    f.write_bytes(out)
    return dst_dir


def tensors_in_order(header):
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def offsets_past_end(header, data):
    name = tensors_in_order(header)[-1]
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**12, end + 10**12]
    return header, data


def size_not_shape(header, data):
    name = tensors_in_order(header)[0]
    header[name]["data_offsets"][1] -= 4
    return header, data


def huge_shape(header, data):
    header[tensors_in_order(header)[0]]["shape"] = [10**9, 10**9]
    return header, data


def overlapping(header, data):
    first, second = tensors_in_order(header)[:2]
    header[second] = dict(header[first])
    return header, data


def string_shape(header, data):
    header[tensors_in_order(header)[0]]["shape"] = ["64", 64]
    return header, data


def truncated(header, data):
    body = json.dumps(header).encode()
    return (struct.pack("<Q", len(body)) + body + data)[: (8 + len(body) + len(data)) // 2]


def lying_header_length(header, data):
    body = json.dumps(header).encode()
    return struct.pack("<Q", 10**15) + body + data


SAFETENSORS_CASES = [
    (offsets_past_end, r"data_offsets=\[1000000\d+, 1000000\d+\] end past the \d+ bytes of data the file holds"),
    (size_not_shape, r"span \d+ bytes, but dtype F32 x shape \[\d+, \d+\] is \d+ bytes"),
    (huge_shape, r"shape \[1000000000, 1000000000\] is 4000000000000000000 bytes"),
    (overlapping, r"overlaps the tensor before it"),
    (string_shape, r"shape=\['64', 64\] is invalid: must be a list of integers >= 0"),
    (truncated, r"end past the \d+ bytes of data the file holds: the file is truncated"),
    (lying_header_length, r"the header length field says 1000000000000000 bytes, but must be at most \d+"),
]


@pytest.mark.parametrize("edit, message", SAFETENSORS_CASES, ids=[c[0].__name__ for c in SAFETENSORS_CASES])
def test_corrupt_safetensors_is_refused_naming_file_and_field(tiny_llama, tmp_path, edit, message):
    path = rewrite_safetensors(tiny_llama[2], tmp_path / "broken", edit)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=message) as info:
        LLM(str(path), dtype="float32")
    assert str(info.value).startswith(str(path / "model.safetensors"))
    assert time.monotonic() - t0 < 10


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_factory, tmp_path_factory):
    return export_hf_to_gguf(tiny_model_factory("llama")[2], tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def gguf_with(src, dst, key, value):
    """A copy of src with one numeric metadata field overwritten in place."""
    import gguf

    shutil.copy(src, dst)
    reader = gguf.GGUFReader(str(dst), "r+")
    reader.fields[key].parts[-1][0] = value
    reader.data.flush()
    del reader
    return dst


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "llama.attention.head_count",
            0,
            r"llama.attention.head_count=0 is invalid: must be an integer in \[1, 1024\]",
        ),
        ("llama.block_count", 4_000_000_000, r"llama.block_count=4000000000 is invalid"),
        ("llama.embedding_length", 0, r"llama.embedding_length=0 is invalid"),
    ],
)
def test_absurd_gguf_sizes_are_refused_under_their_gguf_name(tiny_gguf, tmp_path, key, value, message):
    path = gguf_with(tiny_gguf, tmp_path / "bad.gguf", key, value)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=message) as info:
        LLM(str(path), dtype="float32")
    assert str(info.value).startswith(str(path))
    assert time.monotonic() - t0 < 10


def test_truncated_gguf_names_the_tensor_past_the_end(tiny_gguf, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"tensor 'blk\.\d+\.\w+\.weight' data is bytes \[\d+, \d+\), past the file's"):
        LLM(str(path), dtype="float32")


def test_huge_gguf_context_length_is_capped(tiny_gguf, tmp_path):
    path = gguf_with(tiny_gguf, tmp_path / "long.gguf", "llama.context_length", 4_000_000_000)
    llm = LLM(str(path), dtype="float32", num_kv_blocks=4, block_size=16)
    assert llm.engine.max_model_len == 64


def cli_generate(model):
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "generate", "--model", str(model), "--dtype", "float32", "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r, time.monotonic() - t0


def test_cli_reports_each_corruption_in_one_line(tiny_llama, tiny_gguf, tmp_path):
    """One process per kind (config, safetensors, GGUF): exit 2, the error on one line, no traceback."""
    config_dir = tmp_path / "config"
    shutil.copytree(tiny_llama[2], config_dir)
    cfg = json.loads((config_dir / "config.json").read_text())
    (config_dir / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1e9}))
    cases = [
        (config_dir, "num_hidden_layers=1000000000.0 is invalid"),
        (rewrite_safetensors(tiny_llama[2], tmp_path / "st", truncated), "the file is truncated"),
        (gguf_with(tiny_gguf, tmp_path / "h0.gguf", "llama.attention.head_count", 0), "head_count=0 is invalid"),
    ]
    for model, message in cases:
        r, seconds = cli_generate(model)
        errors = [line for line in r.stderr.splitlines() if line.startswith("tacit: error:")]
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        assert len(errors) == 1 and str(model) in errors[0] and message in errors[0], r.stderr
        assert seconds < 60
