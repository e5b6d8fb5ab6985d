"""`--peer llama.cpp` on an HF MoE directory: the bf16 GGUF it writes for llama.cpp, and llama.cpp
decoding it. Not timed: the numbers are only checked to be there."""

import pytest

from tacit.bench.cli_peers import gguf_for_llamacpp


@pytest.mark.parametrize("arch", ["qwen3_moe_all", "deepseek_v3_qlora"])
def test_llamacpp_peer_gets_a_bf16_gguf_of_a_moe_dir(arch, tiny_model_factory, tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    import gguf
    import torch

    from tacit.bench.peers.llamacpp_peer import LlamaCppBench

    monkeypatch.setenv("TACIT_CACHE_DIR", str(tmp_path))
    _, _, hf_dir = tiny_model_factory(arch)
    path = gguf_for_llamacpp(hf_dir, torch.bfloat16)
    assert path == tmp_path / f"{hf_dir.name}.bf16.gguf"
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    assert types["blk.1.ffn_up_exps.weight"] == gguf.GGMLQuantizationType.BF16  # the experts as tacit runs them
    assert types["blk.1.ffn_gate_inp.weight"] == gguf.GGMLQuantizationType.F32
    peer = LlamaCppBench(path, 64)
    result = peer.latency([[5, 9, 11, 3]], 4)
    assert result["ttft_s"] > 0 and result["decode_tok_s"] > 0
