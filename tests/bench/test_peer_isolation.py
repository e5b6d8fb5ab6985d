"""Peers run in their own processes: one that segfaults or hangs is reported by name with its
exit status, and tacit's and the other peers' results stand."""

import json

import pytest

import tacit.bench.cli_peers as cli_peers
from tacit.cli import main


@pytest.fixture
def failing_peers(monkeypatch):
    monkeypatch.setitem(cli_peers.PEER_FACTORIES, "segfaulting", "standin_peers:SegfaultingBench")
    monkeypatch.setitem(cli_peers.PEER_FACTORIES, "hanging", "standin_peers:HangingBench")


def test_latency_reports_a_crashed_and_a_hung_peer_and_keeps_the_rest(tiny_llama, tmp_path, failing_peers, capsys):
    out = tmp_path / "lat.json"
    args = ["bench", "latency", "--model", str(tiny_llama[2]), "--dtype", "float32", "--batch-sizes", "1"]
    # The timeout covers the transformers peer's start too (a fresh process importing torch and
    # transformers): 5 s ran out on a loaded 2-core machine (CI beside other work), so 30.
    args += ["--input-len", "8", "--output-len", "4", "--repeats", "1", "--peer-timeout", "30", "--json", str(out)]
    args += ["--peer", "segfaulting", "--peer", "transformers", "--peer", "hanging"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "peer segfaulting failed: killed by signal 11 (SIGSEGV) during latency" in printed
    assert "peer hanging failed: no answer to latency in 30 s (killed)" in printed
    data = json.loads(out.read_text())
    assert {row["engine"] for row in data["rows"]} == {"tacit", "transformers"}
    assert set(data["ratios"]) == {"tacit/transformers@batch_size=1"}
    assert set(data["failed_peers"]) == {"segfaulting", "hanging"}


def test_throughput_keeps_tacit_when_its_only_peer_crashes(tiny_llama, tmp_path, failing_peers, capsys):
    args = ["bench", "throughput", "--model", str(tiny_llama[2]), "--dtype", "float32", "--num-prompts", "4"]
    args += ["--input-len", "8", "--output-len", "4", "--peer", "segfaulting"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "peer segfaulting failed: killed by signal 11 (SIGSEGV) during throughput" in printed
    assert "tacit" in printed


def test_an_unknown_peer_is_refused_by_name(capsys):
    assert main(["bench", "latency", "--batch-sizes", "1", "--peer", "vllm"]) != 0
    err = capsys.readouterr().err
    assert "--peer 'vllm' is not a peer tacit knows; one of: transformers, llama.cpp" in err
    assert "measuring read bandwidth" not in err
