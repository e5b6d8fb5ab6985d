"""tacit bench attention --dsa: its two closures compute the same attention when the top-k
covers the context, and differ (sparse) when it does not; its rows carry both kinds' bytes."""

import pytest
import torch

from tacit.bench.dsa_attention import dsa_attention_case, measure_dsa_attention

TINY = dict(
    hidden_size=64,
    num_attention_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=32,
    q_lora_rank=24,
    index_n_heads=4,
    index_head_dim=32,
    index_topk=16,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dsa_equals_dense_when_the_topk_covers_the_context(dtype):
    dense, sparse, _, _ = dsa_attention_case({**TINY, "index_topk": 64}, context=50, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(sparse().float(), dense().float(), rtol=tol, atol=tol)
    dense, sparse, _, _ = dsa_attention_case(TINY, context=50, dtype=dtype)
    assert not torch.allclose(sparse().float(), dense().float(), rtol=tol, atol=tol)


def test_rows_name_both_kinds_with_their_bytes():
    rows = measure_dsa_attention(TINY, context=40, repeats=1)
    assert [r["attention"] for r in rows] == ["dense absorbed MLA", "DSA (indexer + top-16 MLA)"]
    assert [r["kv_bytes_per_token"] for r in rows] == [(32 + 16) * 2, (32 + 16 + 32) * 2]
    assert rows[0]["speedup"] == 1.0 and all(r["ms_per_call"] > 0 for r in rows)


def test_a_config_without_an_indexer_is_refused():
    with pytest.raises(ValueError, match="--dsa needs a DeepSeek-V3.2 config.*index_topk is missing"):
        dsa_attention_case({k: v for k, v in TINY.items() if k != "index_topk"}, context=8)
