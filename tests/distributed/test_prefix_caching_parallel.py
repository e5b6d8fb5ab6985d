"""The prefix cache across ranks: one scheduler decides every hit, so every rank's pool holds the
same cached blocks (tensor parallel), or each rank caches its own requests' blocks and a request
goes to the rank caching its prefix (data-parallel attention). Float32 greedy: the same tokens
as one process without the cache."""

import pytest

from tacit import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19]
PROMPTS = [SHARED + [3, 4], SHARED + [5], SHARED + [6, 7, 8], SHARED + [3, 4, 9]]


@pytest.mark.parametrize("layout", [{}, {"data_parallel_attention": True}], ids=["tp2", "dp-attention"])
def test_hits_across_ranks_give_one_process_tokens(tiny_model_factory, layout):
    _, _, path = tiny_model_factory("qwen3")
    plain = LLM(str(path), dtype="float32", block_size=4, enable_prefix_caching=False)
    ref = [plain.generate([p], PARAMS)[0].outputs[0].token_ids for p in PROMPTS]
    llm = LLM(str(path), dtype="float32", block_size=4, tensor_parallel_size=2, **layout)
    try:
        outs = [llm.generate([p], PARAMS)[0] for p in PROMPTS]  # one at a time: each finds the last's blocks
        assert [o.outputs[0].token_ids for o in outs] == ref
        assert [o.num_cached_tokens for o in outs] == [0, 8, 8, 8]  # a hit is in the request's own pool
    finally:
        llm.engine.shutdown()


def test_a_restarted_tensor_parallel_engine_finds_every_ranks_blocks_on_disk(tiny_model_factory, tmp_path):
    """Each rank keeps its own shard of every block in the disk tier; after a restart a block
    counts as held only when every rank has it."""
    _, _, path = tiny_model_factory("qwen3")
    plain = LLM(str(path), dtype="float32", block_size=4, enable_prefix_caching=False)
    ref = plain.generate([PROMPTS[1]], PARAMS)[0].outputs[0].token_ids
    tier = {"kv_offloading_size": 1 / 64, "kv_offloading_dir": str(tmp_path)}
    first = LLM(str(path), dtype="float32", block_size=4, tensor_parallel_size=2, **tier)
    try:
        first.generate([PROMPTS[0]], PARAMS)
    finally:
        first.engine.shutdown()
    ranks = sorted(p.name for p in tmp_path.glob("*/*"))
    assert ranks == ["rank0-of-2", "rank1-of-2"]
    again = LLM(str(path), dtype="float32", block_size=4, tensor_parallel_size=2, **tier)
    try:
        out = again.generate([PROMPTS[1]], PARAMS)[0]
        assert out.outputs[0].token_ids == ref
        assert out.num_cached_tokens == 8
        assert again.engine.get_stats().external_prefix_cache_hits == 8
    finally:
        again.engine.shutdown()
