"""KV cache specs, their grouping, and the KVCacheConfig's checks (no model needed)."""

import pytest
import torch

from tacit.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec
from tacit.memory.kv_cache_utils import get_kv_cache_groups


def full(block_size=16, dtype=torch.bfloat16, heads=2):
    return FullAttentionSpec(block_size=block_size, dtype=dtype, num_kv_heads=heads, head_size=64)


def test_layers_group_by_equal_spec_in_the_order_of_their_first_layer():
    mla = MLAAttentionSpec(block_size=16, dtype=torch.bfloat16, kv_lora_rank=512, rope_dim=64)
    specs = {"l0": full(), "l1": mla, "l2": full(), "l3": full(heads=4), "l4": mla}
    groups = get_kv_cache_groups(specs)
    assert [(g.layer_names, g.kv_cache_spec) for g in groups] == [
        (("l0", "l2"), full()),
        (("l1", "l4"), mla),
        (("l3",), full(heads=4)),
    ]
    config = KVCacheConfig(num_blocks=10, kv_cache_groups=groups, max_model_len=160)
    # K and V of 2 heads x 64 in bf16 (512 B a token) twice, MLA's 576-wide row (1152 B), 4 heads (1024 B).
    assert config.bytes_per_block == 16 * (2 * 512 + 2 * 1152 + 1024)
    assert config.capacity_tokens == 160
    with pytest.raises(ValueError, match="no KV cache layers to group"):
        get_kv_cache_groups({})


def test_int8_specs_count_each_rows_scale():
    assert full(dtype=torch.int8).bytes_per_token == 2 * 2 * (64 + 4)
    assert full(dtype=torch.int8).kv_cache_shape(3) == (2, 3, 2, 16 * (64 + 4))
    mla = MLAAttentionSpec(block_size=16, dtype=torch.int8, kv_lora_rank=512, rope_dim=64)
    assert mla.quantized and mla.bytes_per_token == (512 + 4) + (64 + 4) and mla.kv_cache_shape(3) == (3, 16, 584)
    assert not full().quantized and full().kv_cache_shape(3) == (2, 3, 16, 2, 64)


def test_bad_specs_and_configs_are_refused():
    with pytest.raises(ValueError, match="dtype=torch.int32 is not a KV cache dtype"):
        full(dtype=torch.int32)
    with pytest.raises(ValueError, match="block_size=0 is invalid"):
        full(block_size=0)
    with pytest.raises(ValueError, match="groups of different block sizes \\[8, 16\\]"):
        KVCacheConfig(
            num_blocks=4,
            kv_cache_groups=(KVCacheGroupSpec(("a",), full(8)), KVCacheGroupSpec(("b",), full(16, heads=4))),
            max_model_len=32,
        )
    with pytest.raises(ValueError, match="no KV cache groups"):
        KVCacheConfig(num_blocks=4, kv_cache_groups=(), max_model_len=32)


def test_the_measured_swap_bandwidth_is_not_part_of_a_configs_equality():
    groups = (KVCacheGroupSpec(("a",), full()),)
    a = KVCacheConfig(num_blocks=4, kv_cache_groups=groups, max_model_len=64, swap_bytes_per_s=1e9)
    assert a == KVCacheConfig(num_blocks=4, kv_cache_groups=groups, max_model_len=64, swap_bytes_per_s=2e9)
    assert a != KVCacheConfig(num_blocks=5, kv_cache_groups=groups, max_model_len=64)
