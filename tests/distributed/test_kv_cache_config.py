"""The KV handshake under tensor parallelism: every rank answers a KVCacheConfig, the ranks'
are checked equal, and the engine keeps it; what it says is what one process says, but for the
heads a rank holds."""

import dataclasses

import pytest
import torch

from tacit import LLM
from tacit.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from tacit.worker import rank as rank_module


def kv_config(path, **kwargs) -> KVCacheConfig:
    llm = LLM(str(path), dtype="float32", num_kv_blocks=8, block_size=8, **kwargs)
    try:
        return llm.engine.kv_cache_config
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("arch, data_parallel", [("deepseek_v3", False), ("llama", False), ("deepseek_v3", True)])
def test_tensor_parallel_ranks_answer_the_config_one_process_does(tiny_model_factory, arch, data_parallel):
    _, _, path = tiny_model_factory(arch)
    one = kv_config(path)
    two = kv_config(path, tensor_parallel_size=2, data_parallel_attention=data_parallel)
    assert (two.num_blocks, two.block_size, two.max_model_len) == (8, 8, 64)
    if data_parallel:  # a pool per rank, each rank caching whole latents of its own requests
        assert two.num_pools == 2 and dataclasses.replace(two, num_pools=1) == one
    elif arch == "deepseek_v3":
        assert two == one  # MLA's latent is whole on every rank: the same cache
    else:  # each rank caches its half of the kv heads
        (g1,), (g2,) = one.kv_cache_groups, two.kv_cache_groups
        half = dataclasses.replace(g1.kv_cache_spec, num_kv_heads=g1.kv_cache_spec.num_kv_heads // 2)
        assert g2 == KVCacheGroupSpec(g1.layer_names, half)
        assert two.bytes_per_block * 2 == one.bytes_per_block


def test_ranks_whose_configs_differ_are_refused(monkeypatch):
    spec = FullAttentionSpec(block_size=8, dtype=torch.float32, num_kv_heads=1, head_size=16)
    mine = KVCacheConfig(num_blocks=8, kv_cache_groups=(KVCacheGroupSpec(("l0",), spec),), max_model_len=64)
    other = dataclasses.replace(mine, num_blocks=7)

    def gather(out, obj):  # rank 1 answers `other` (read when called)
        out[:] = [obj, other]

    monkeypatch.setattr(rank_module.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(rank_module.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(rank_module.dist, "all_gather_object", gather)
    with pytest.raises(RuntimeError, match=r"rank 0's KV cache configuration .* differs from rank\(s\) \[1\]"):
        rank_module.agree_kv_cache_config(mine)
    other = dataclasses.replace(mine, swap_bytes_per_s=5.0)  # a measurement: not a disagreement
    assert rank_module.agree_kv_cache_config(mine) is mine
