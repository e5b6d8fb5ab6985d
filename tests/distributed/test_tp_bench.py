"""What `tacit bench latency` reports about communication under tensor parallelism."""

import pytest

from tacit import LLM
from tacit.bench.peers.tacit_engine import TacitBench
from tacit.kernels.cpu_kernels import load_cpu_kernels


@pytest.mark.parametrize("overlap", [False, True])
def test_bench_reports_prefill_communication_and_the_hidden_fraction(tiny_llama, overlap):
    _, _, path = tiny_llama
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2, two_batch_overlap=overlap)
    try:
        res = TacitBench(llm.engine).latency([[5, 6, 7, 8] * 8, [9, 10, 11] * 5, [12] * 20], 4)
    finally:
        llm.engine.shutdown()
    # float32 has no fused C++ step (no decode comm_share); its torch steps all-reduce every layer.
    assert "comm_share" not in res
    assert 0 < res["prefill_comm_share"] < 1
    if overlap:  # each micro-batch's sums travel while the other computes: some time is hidden
        assert 0 < res["prefill_comm_hidden"] < 1
    else:
        assert res["prefill_comm_hidden"] == 0.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_process_reports_no_communication(tiny_llama, dtype):
    """bf16 runs the fused decode step, whose one-process form once made the bench read the
    torch path's counters that one process does not have."""
    _, _, path = tiny_llama
    res = TacitBench(LLM(str(path), dtype=dtype).engine).latency([[5, 6, 7]], 3)
    assert not {"prefill_comm_share", "prefill_comm_hidden"} & set(res)
    assert res.get("comm_share", 0.0) == 0.0


@pytest.mark.skipif(load_cpu_kernels() is None, reason="needs the AVX512-BF16 CPU kernels (decode steps in C++)")
def test_fused_decode_shares_split_at_the_first_token(tiny_llama):
    """bf16: decode steps run in C++, but a vocabulary-split embedding all-reduces in the torch
    path every step; that time belongs to the decode share, not the prefill's (it once pushed
    the prefill share above 1 on a 64-token run)."""
    _, _, path = tiny_llama
    llm = LLM(str(path), dtype="bfloat16", tensor_parallel_size=2)
    try:
        bench = TacitBench(llm.engine)
        res = bench.latency([[5, 6, 7, 8] * 8], 48)
        assert llm.engine.model.model.embed_tokens.sharded
    finally:
        llm.engine.shutdown()
    assert 0 < res["comm_share"] < 1 and 0 < res["prefill_comm_share"] < 1
