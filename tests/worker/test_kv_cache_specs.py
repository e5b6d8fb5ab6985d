"""The KV cache spec each attention backend declares for a model's layers, the pool allocated
from those specs, and the KVCacheConfig the engine builds its scheduler side from."""

import pytest
import torch
from torch import nn

from tacit import LLM
from tacit.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MLAAttentionSpec, MLAIndexerAttentionSpec
from tacit.layers.kv_cache import KVCacheLayer
from tacit.worker.kv_allocation import allocate_kv_caches

# Bytes one token takes in one layer, worked out by hand from the tiny models (tests/tiny_models.py):
# llama: 2 kv heads of 16 -> K and V: 2 x 2 x 16 values; int8 adds a 4-byte scale to each row.
# deepseek_v3: a 32-wide latent and an 8-wide rotated key part; int8: a scale after each of the two.
# deepseek_v32: deepseek_v3's row and the indexer's 16-wide key; int8: a scale after each of the three.
BYTES_PER_TOKEN = {
    ("llama", "float32"): 2 * 2 * 16 * 4,
    ("llama", "bfloat16"): 2 * 2 * 16 * 2,
    ("llama", "int8"): 2 * 2 * (16 + 4),
    ("deepseek_v3", "float32"): (32 + 8) * 4,
    ("deepseek_v3", "bfloat16"): (32 + 8) * 2,
    ("deepseek_v3", "int8"): (32 + 4) + (8 + 4),
    ("deepseek_v32", "float32"): (32 + 8 + 16) * 4,
    ("deepseek_v32", "bfloat16"): (32 + 8 + 16) * 2,
    ("deepseek_v32", "int8"): (32 + 4) + (8 + 4) + (16 + 4),
}
NUM_LAYERS = {"llama": 2, "deepseek_v3": 3, "deepseek_v32": 3}
SPEC_TYPE = {"llama": FullAttentionSpec, "deepseek_v3": MLAAttentionSpec, "deepseek_v32": MLAIndexerAttentionSpec}


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3", "deepseek_v32"])
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "int8"])
def test_backends_declare_the_spec_the_pool_is_allocated_from(tiny_model_factory, arch, kv_dtype):
    _, _, path = tiny_model_factory(arch)
    engine = LLM(str(path), dtype="float32", kv_cache_dtype=kv_dtype, num_kv_blocks=6, block_size=8).engine
    config = engine.kv_cache_config
    layers = {n: m for n, m in engine.model.named_modules() if isinstance(m, KVCacheLayer)}
    assert len(layers) == NUM_LAYERS[arch]
    # Every layer of these models has one spec: one group holding every KV layer, in order.
    (group,) = config.kv_cache_groups
    spec = group.kv_cache_spec
    assert group.layer_names == tuple(layers)
    assert type(spec) is SPEC_TYPE[arch]
    assert spec.dtype == getattr(torch, kv_dtype) and spec.quantized == (kv_dtype == "int8")
    assert spec.block_size == config.block_size == 8 and config.num_blocks == 6
    assert spec.bytes_per_token == BYTES_PER_TOKEN[arch, kv_dtype]
    # What the pool was sized by is what the tensors hold.
    allocated = sum(m.kv_cache.numel() * m.kv_cache.element_size() for m in layers.values())
    assert allocated == config.num_blocks * config.bytes_per_block
    assert config.bytes_per_block == NUM_LAYERS[arch] * 8 * BYTES_PER_TOKEN[arch, kv_dtype]
    for m in layers.values():  # each layer knows the spec it was allocated with
        assert m.kv_cache_spec is spec and tuple(m.kv_cache.shape) == spec.kv_cache_shape(6)
    # The scheduler side is built from the config alone.
    kv = engine.scheduler.kv
    assert (kv.num_blocks, kv.block_size, kv.capacity_tokens) == (6, 8, 48)
    assert engine.max_model_len == config.max_model_len == 48  # capped at what the pool holds
    assert engine.scheduler.swapper.bytes_per_block == config.bytes_per_block
    assert config.swap_bytes_per_s > 0


def test_an_explicit_max_model_len_is_kept_and_swap_off_measures_nothing(tiny_llama):
    engine = LLM(str(tiny_llama[2]), dtype="float32", num_kv_blocks=4, block_size=8, max_model_len=100, swap_space=0)
    config = engine.engine.kv_cache_config
    assert config.max_model_len == engine.engine.max_model_len == 100  # the user's, beyond the 32-token pool
    assert config.swap_bytes_per_s is None and engine.engine.scheduler.swapper is None


class SelfShapedLayer(nn.Module, KVCacheLayer):
    """A layer that computes its own cache shape (as DeepSeek's MLAAttention does), wrongly."""

    kv_block_dim = 0

    def allocate_kv_cache(self, num_blocks, block_size, dtype, device):
        self.kv_cache = torch.zeros(num_blocks, block_size, 41, dtype=dtype, device=device)


def test_a_layer_allocating_other_than_its_spec_is_refused():
    spec = MLAAttentionSpec(block_size=4, dtype=torch.float32, kv_lora_rank=32, rope_dim=8)
    layers = {"model.layers.0.self_attn": SelfShapedLayer()}
    with pytest.raises(RuntimeError, match=r"layer model.layers.0.self_attn \(SelfShapedLayer\) allocated a KV"):
        allocate_kv_caches(layers, (KVCacheGroupSpec(tuple(layers), spec),), 3, torch.device("cpu"))
    ok = SelfShapedLayer()
    ok.allocate_kv_cache = lambda n, b, d, dev: setattr(ok, "kv_cache", torch.zeros(n, b, 40, dtype=d))
    allocate_kv_caches({"a": ok}, (KVCacheGroupSpec(("a",), spec),), 3, torch.device("cpu"))
    assert ok.kv_cache_spec is spec


def test_a_layer_without_a_backend_has_no_spec():
    from tacit.layers.attention import Attention

    with pytest.raises(RuntimeError, match="Attention has no attention backend bound"):
        Attention(num_heads=4, head_dim=16, num_kv_heads=2, scale=1.0).get_kv_cache_spec(4, torch.float32)


def test_the_dsa_spec_counts_v32s_latent_and_index_key():
    """DeepSeek-V3.2's dims (kernels' docstring): 1,408 bytes a token in bf16 (1,152 of latent +
    256 of index key), 716 in int8; the tensor is block-major [blocks, block_size * row]."""
    dims = dict(kv_lora_rank=512, rope_dim=64, index_head_dim=128)
    bf16 = MLAIndexerAttentionSpec(block_size=16, dtype=torch.bfloat16, **dims)
    assert (bf16.latent_numel_per_token, bf16.index_numel_per_token) == (576, 128)
    assert bf16.bytes_per_token == 1408 and bf16.kv_cache_shape(3) == (3, 16 * 704)
    int8 = MLAIndexerAttentionSpec(block_size=16, dtype=torch.int8, **dims)
    assert int8.bytes_per_token == (512 + 4) + (64 + 4) + (128 + 4) == 716
    with pytest.raises(ValueError, match="index_head_dim=0 must be >= 1"):
        MLAIndexerAttentionSpec(block_size=16, dtype=torch.bfloat16, kv_lora_rank=512, rope_dim=64, index_head_dim=0)
