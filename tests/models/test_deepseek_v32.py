"""DeepSeek-V3.2's indexer keys travel with the latents (one MLAIndexerAttentionSpec cache):
a prefix-cache hit and a swapped-out, swapped-in request decode as a fresh run does."""

import pytest
import torch

from tacit import LLM, SamplingParams

SP = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def v32(tiny_model_factory):
    path = str(tiny_model_factory("deepseek_v32")[2])
    g = torch.Generator().manual_seed(7)
    base = torch.randint(3, 384, (120,), generator=g).tolist()  # past index_topk 24: sparse
    prompts = [base + torch.randint(3, 384, (n,), generator=g).tolist() for n in (5, 40, 70)]
    ref = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(prompts, SP)]
    return path, prompts, ref


def test_a_prefix_cache_hit_reads_the_cached_index_keys(v32):
    path, prompts, ref = v32
    llm = LLM(path, dtype="float32", enable_prefix_caching=True)
    llm.generate(prompts[:1], SP)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, SP)] == ref
    assert llm.engine.get_stats().prefix_cache_hits >= 3 * 112  # 7 whole blocks of 16 per prompt


def test_swap_preemption_carries_the_index_keys(v32):
    path, prompts, ref = v32
    llm = LLM(
        path, dtype="float32", num_kv_blocks=24, block_size=16, preemption_mode="swap", max_num_batched_tokens=128
    )
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, SP)] == ref
    assert llm.engine.scheduler.swapper.num_swapped_out > 0


def test_glm_shared_topk_layers_cache_the_latent_only(tiny_model_factory):
    """GLM-5's layer 1 shares layer 0's top-k: no indexer, so its cache is plain MLA; the two
    kinds are two groups of one pool (one block table: same block size)."""
    from tacit.kv_cache_interface import MLAAttentionSpec, MLAIndexerAttentionSpec

    engine = LLM(str(tiny_model_factory("glm_moe_dsa")[2]), dtype="float32", num_kv_blocks=6, block_size=8).engine
    groups = {type(g.kv_cache_spec): g.layer_names for g in engine.kv_cache_config.kv_cache_groups}
    assert groups == {
        MLAIndexerAttentionSpec: ("model.layers.0.self_attn", "model.layers.2.self_attn"),
        MLAAttentionSpec: ("model.layers.1.self_attn",),
    }
    assert engine.model.model.layers[1].self_attn.indexer is None
    assert engine.kv_cache_config.bytes_per_block == 8 * (2 * (32 + 8 + 16) + (32 + 8)) * 4


def test_a_random_v32_checkpoint_carries_its_mtp_layer(tmp_path):
    """bench/random_model.py's writer on a small V3.2 shape (random:deepseek-v32-* use it): the
    checkpoint loads, and its MTP layer drafts without changing greedy output."""
    from tacit.bench.random_model import SHAPES, write_random_model

    shape = dict(SHAPES["deepseek-v32-small"])
    shape.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32)
    shape.update(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, intermediate_size=64)
    shape.update(moe_intermediate_size=16, n_routed_experts=8, index_n_heads=4, index_head_dim=16, index_topk=8)
    shape.update(vocab_size=600, max_position_embeddings=512)
    path = write_random_model(shape, tmp_path)
    assert (path / "model-mtp.safetensors").exists()
    prompts = [list(range(10, 40)), list(range(50, 62))]
    want = [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32").generate(prompts, SP)]
    spec = {"method": "mtp", "num_speculative_tokens": 2, "min_speculative_tokens": 2}
    llm = LLM(str(path), dtype="float32", speculative_config=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, SP)] == want


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_bf16_engine_keeps_the_indexer_head_weights_in_float32(v32, kv_dtype):
    """A bf16 engine: weights_proj stays float32 (no bf16 linear method takes it), and its
    teacher-forced scores stay near float32's. Measured on this tiny model: median KL 2.7e-3
    (bf16 cache) and 1.8e-3 (int8), where the bf16 weights' rounding also moves the router."""
    path, _, _ = v32
    seqs = [[(7 * i) % 300 + 3 for i in range(120)]]
    ref = LLM(path, dtype="float32").score_full_logprobs(seqs)[0]
    llm = LLM(path, dtype="bfloat16", kv_cache_dtype=kv_dtype)
    assert llm.engine.model.model.layers[0].self_attn.indexer.weights_proj.weight.dtype == torch.float32
    got = llm.score_full_logprobs(seqs)[0].float()
    kl = (ref.exp() * (ref - got)).sum(-1)
    assert kl.median() < 1e-2
