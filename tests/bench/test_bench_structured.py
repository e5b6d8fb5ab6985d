"""`tacit bench serve --structured-fraction`: the same workload with and without json_schema
requests in one invocation, against a real tiny `tacit serve`."""

import json
import subprocess
import sys

import pytest
from tiny_server import tiny_server

from tacit.bench.serve import structured_body, structured_mask


def test_structured_mask_is_seeded_and_exact():
    m = structured_mask(10, 0.5, seed=1)
    assert sum(m) == 5 and m == structured_mask(10, 0.5, seed=1)
    assert not any(structured_mask(10, 0.0, 1)) and all(structured_mask(10, 1.0, 1))
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        structured_mask(10, 1.5, 1)
    schema = structured_body(8)["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["summary"]["minLength"] == 128  # longer than 8 tokens can write


def test_bench_serve_compares_structured_fractions_in_one_run(tiny_llama, tmp_path):
    with tiny_server(tiny_llama[2]) as (url, env):
        out = tmp_path / "structured.json"
        r = subprocess.run(
            [sys.executable, "-m", "tacit.cli", "bench", "serve", "--url", url, "--num-prompts", "6"]
            + ["--input-len", "8", "--output-len", "6", "--dist", "fixed", "--structured-fraction", "0,0.5"]
            + ["--json", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 0, r.stderr + r.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [(x["structured_fraction"], x["num_structured"]) for x in runs] == [(0.0, 0), (0.5, 3)]
    assert all(x["completed"] == 6 and not x["failed"] and x["output_tok_s"] > 0 for x in runs)
    assert "vs_first" in r.stdout
