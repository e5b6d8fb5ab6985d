"""KV cache specs, their grouping, and the KVCacheConfig's checks (no model needed)."""

import pytest
import torch

from tacit.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from tacit.memory.kv_cache_utils import get_kv_cache_groups


def full(block_size=16, dtype=torch.bfloat16, heads=2):
    return FullAttentionSpec(block_size=block_size, dtype=dtype, num_kv_heads=heads, head_size=64)


def sliding(window=32, block_size=16, heads=2):
    return SlidingWindowSpec(
        block_size=block_size, dtype=torch.bfloat16, num_kv_heads=heads, head_size=64, sliding_window=window
    )


def test_one_spec_is_one_group_of_every_layer():
    groups = get_kv_cache_groups({f"l{i}": full() for i in range(3)})
    assert [(g.layer_names, g.kv_cache_spec) for g in groups] == [(("l0", "l1", "l2"), full())]
    config = KVCacheConfig(num_blocks=10, kv_cache_groups=groups, max_model_len=160)
    assert config.bytes_per_block == 16 * 512 * 3  # K and V of 2 heads x 64 in bf16: 512 B a token a layer
    assert config.capacity_tokens == 160 and config.sliding_windows == (None,)
    with pytest.raises(ValueError, match="no KV cache layers to group"):
        get_kv_cache_groups({})


def test_sliding_and_full_layers_form_groups_of_the_smallest_kinds_size():
    # Gemma 3's 5:1 pattern at 12 layers: 10 sliding, 2 full -> five sliding groups of 2 and one full.
    specs = {f"l{i}": full() if i % 6 == 5 else sliding() for i in range(12)}
    groups = get_kv_cache_groups(specs)
    assert [g.layer_names for g in groups] == [
        ("l0", "l1"),
        ("l2", "l3"),
        ("l4", "l6"),
        ("l7", "l8"),
        ("l9", "l10"),
        ("l5", "l11"),
    ]
    config = KVCacheConfig(num_blocks=100, kv_cache_groups=groups, max_model_len=1000, max_chunk_tokens=64)
    assert config.sliding_windows == (32, 32, 32, 32, 32, None)
    # Groups share tensors: a block id is a page of each of the 2 tensors, not of all 12 layers.
    assert config.bytes_per_block == 16 * 512 * 2
    # Each sliding group holds at most 31 window positions and a 64-token chunk: 95 consecutive
    # positions, 7 blocks of 16 at the worst alignment; the full group gets the rest.
    assert config.capacity_tokens == (100 - 5 * 7) * 16


def test_kinds_that_keep_every_token_share_one_table_with_tensors_of_their_own():
    mla = MLAAttentionSpec(block_size=16, dtype=torch.bfloat16, kv_lora_rank=512, rope_dim=64)
    specs = {"l0": full(), "l1": mla, "l2": full(), "l3": full(heads=4), "l4": mla}
    groups = get_kv_cache_groups(specs)
    assert [(g.layer_names, g.kv_cache_spec) for g in groups] == [
        (("l0", "l2"), full()),
        (("l1", "l4"), mla),
        (("l3",), full(heads=4)),
    ]
    config = KVCacheConfig(num_blocks=10, kv_cache_groups=groups, max_model_len=160)
    # One table: a block id is a page of every layer (2 x 512 B, 2 x MLA's 1152 B, 1024 B a token).
    assert config.bytes_per_block == 16 * (2 * 512 + 2 * 1152 + 1024)
    assert config.sliding_windows == (None,) and config.capacity_tokens == 160


def test_a_hybrid_models_groups_must_share_tensors():
    with pytest.raises(ValueError, match="cannot share cache tensors"):
        get_kv_cache_groups({"l0": full(heads=4), "l1": sliding()})


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
    with pytest.raises(ValueError, match="cannot share cache tensors"):
        KVCacheConfig(
            num_blocks=4,
            kv_cache_groups=(KVCacheGroupSpec(("a",), full(heads=4)), KVCacheGroupSpec(("b",), sliding())),
            max_model_len=32,
        )
    with pytest.raises(ValueError, match="sliding_window=0 must be an integer >= 1"):
        sliding(window=0)
    with pytest.raises(ValueError, match="no KV cache groups"):
        KVCacheConfig(num_blocks=4, kv_cache_groups=(), max_model_len=32)


def test_the_measured_swap_bandwidth_is_not_part_of_a_configs_equality():
    groups = (KVCacheGroupSpec(("a",), full()),)
    a = KVCacheConfig(num_blocks=4, kv_cache_groups=groups, max_model_len=64, swap_bytes_per_s=1e9)
    assert a == KVCacheConfig(num_blocks=4, kv_cache_groups=groups, max_model_len=64, swap_bytes_per_s=2e9)
    assert a != KVCacheConfig(num_blocks=5, kv_cache_groups=groups, max_model_len=64)
