"""Sliding windows, DeepSeek-V3.2's sparse attention (DSA) and MXFP4 experts in the performance
model, against hand counts; and a config without their keys priced as before."""

from __future__ import annotations

import contextlib
import io
import itertools

import pytest

from tacit.cli import main
from tacit.perf_model.attention_ops import attended_keys, rows_read
from tacit.perf_model.dtypes import weight_bytes_per_value
from tacit.perf_model.memory import device_memory, kv_bytes_per_sequence, kv_bytes_per_token, weight_bytes
from tacit.perf_model.model_shape import layer_windows, load_hf_config, shape_from_hf
from tacit.perf_model.operators import Parallel, StepShape, step_ops
from tests.perf_model.test_counts import DENSE, MLA

# gpt-oss's attention in miniature: every other layer a 128-token window, head_dim 64, 4 query
# heads over 2 KV heads; 4 experts of 32 in MXFP4 (its quantization_config), no dense MLP.
GPT_OSS = {
    "architectures": ["GptOssForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 128,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]},
}
# MLA with DeepSeek-V3.2's indexer: index_topk 2048 as the real model, 4 index heads of 16
DSA = {**MLA, "architectures": ["DeepseekV32ForCausalLM"], "q_lora_rank": 24}
DSA.update(index_topk=2048, index_n_heads=4, index_head_dim=16)


def _by_name(ops):
    return {o.name: o for o in ops}


def test_layer_windows_follow_the_config_rules():
    assert layer_windows(GPT_OSS) == (128, 0)
    gemma = {"num_hidden_layers": 12, "sliding_window": 1024, "sliding_window_pattern": 6}
    assert layer_windows(gemma) == (1024,) * 5 + (0,) + (1024,) * 5 + (0,)  # every 6th layer global
    qwen = {"num_hidden_layers": 3, "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 1}
    assert layer_windows(qwen) == (0, 4096, 4096)
    # Qwen2's checkpoints set sliding_window but switch it off: no window, whatever layer_types says
    off = {**GPT_OSS, "use_sliding_window": False}
    assert layer_windows(off) == () and layer_windows(DENSE) == ()
    with pytest.raises(ValueError, match="layer_types has 1 entries; num_hidden_layers is 2"):
        layer_windows({**GPT_OSS, "layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match="sliding_window=None"):
        layer_windows({**GPT_OSS, "sliding_window": None})


def test_attended_keys_match_a_per_query_count():
    for c, t, limit in itertools.product((0, 5, 127, 128, 300), (1, 3, 130, 400), (0, 1, 128, 2048)):
        step = StepShape(2, t, c)
        # the query at 1-based position n attends min(n, limit) keys
        want = 2 * sum(min(n, limit) if limit else n for n in range(c + 1, c + t + 1))
        assert attended_keys(step, limit) == want, (c, t, limit)
        rows = min(c + t, limit - 1 + t) if limit else c + t  # from the first query's window start
        assert rows_read(step, limit) == 2 * rows


def test_a_sliding_layer_at_32k_reads_its_window_only():
    s = shape_from_hf(GPT_OSS)
    assert s.windows == (128, 0) and s.layer_counts == {0: 1, 128: 1}
    ops = _by_name(step_ops(s, StepShape(batch=1, new_tokens=1, context=32767)))
    kv_row = 2 * 2 * 64 * 2  # K and V of 2 heads of 64 in bf16 per token
    qo = 2 * 4 * 64 * 2  # the query and output rows of 4 heads
    full, sliding = ops["attention"], ops["sliding_attention"]
    assert full.bytes == 32768 * kv_row + kv_row + qo and full.flops == 4 * 4 * 64 * 32768
    # the window: the query's own position and the 127 before it
    assert sliding.bytes == 128 * kv_row + kv_row + qo and sliding.flops == 4 * 4 * 64 * 128
    assert (full.layers, sliding.layers) == (1, 1)
    # a 200-token prompt: query n attends min(n, 128) keys; every row is read
    prefill = _by_name(step_ops(s, StepShape(1, 200, 0)))["sliding_attention"]
    assert prefill.flops == 4 * 4 * 64 * (128 * 129 / 2 + 72 * 128)
    assert prefill.bytes == 200 * kv_row + 200 * kv_row + 200 * qo


def test_a_sliding_layers_kv_is_bounded_by_its_window():
    s = shape_from_hf(GPT_OSS)
    row = 2 * 2 * 64 * 2
    assert kv_bytes_per_token(s, Parallel(), "bf16") == 2 * row
    # 32,768 tokens: the full layer keeps them all; the sliding one the 9 blocks of 16 that its
    # 128-token window (127 before the next query, and it) can straddle
    assert kv_bytes_per_sequence(s, Parallel(), "bf16", 32768) == 32768 * row + 144 * row
    assert kv_bytes_per_sequence(s, Parallel(), "bf16", 100) == 2 * 100 * row  # shorter than the window
    mem = device_memory(s, Parallel(), "bf16", "bf16", batch=3, input_len=32000, output_len=768)
    assert mem.kv_cache == 3 * (32768 * row + 144 * row)


def test_dsa_decode_at_32k_scans_every_index_key_and_attends_2048_latent_rows():
    s = shape_from_hf(DSA)
    assert s.is_dsa and (s.index_n_heads, s.index_head_dim, s.index_topk) == (4, 16, 2048)
    ops = _by_name(step_ops(s, StepShape(batch=1, new_tokens=1, context=32767)))
    assert "attention_latent" not in ops
    indexer, sparse = ops["indexer"], ops["attention_sparse"]
    # every one of the 32,768 index keys (16 bf16 values) read and scored by 4 heads of 16: a dot
    # product, a ReLU and the weighted sum; float32 scores written and read by the top-k, 2048
    # int32 indices out, one key written, the query's 4 x 16 values
    assert indexer.bytes == 32768 * 32 + 2 * 4 * 32768 + 2048 * 4 + 32 + 4 * 16 * 2
    assert indexer.flops == 32768 * (2 * 4 * 16 + 2 * 4)
    # the latent (32 + 8 values, bf16 80 B) of the 2048 selected tokens only
    assert sparse.bytes == 2048 * 80 + 80 + 4 * 2 * 32 * 2
    assert sparse.flops == 2 * 4 * 40 * 2048 + 2 * 4 * 32 * 2048
    # the indexer's projections: wq_b from the q_lora activation, wk and the heads' weights from x
    assert ops["index_q_proj"].flops == 2 * 24 * 4 * 16 and ops["index_k_proj"].flops == 2 * 64 * 16
    assert ops["index_weights_proj"].weight_dtype == "bf16"


def test_dsa_below_index_topk_attends_as_dense_mla():
    dense = _by_name(step_ops(shape_from_hf({**DSA, "index_topk": 0}), StepShape(2, 1, 1000)))
    sparse = _by_name(step_ops(shape_from_hf(DSA), StepShape(2, 1, 1000)))
    assert sparse["attention_sparse"].bytes == dense["attention_latent"].bytes
    assert sparse["attention_sparse"].flops == dense["attention_latent"].flops


def test_dsa_cache_bytes_per_token_of_the_recipe_config():
    s = shape_from_hf(load_hf_config("DeepSeek-V3.2-Exp"))
    assert (s.num_layers, s.index_n_heads, s.index_head_dim, s.index_topk) == (61, 64, 128, 2048)
    # MLA's 576-value latent (1152 B in bf16) and the indexer's 128-value key (256 B) a layer
    assert kv_bytes_per_token(s, Parallel(), "bf16") == 61 * (1152 + 256)
    # int8: each row's values and a float32 scale
    assert kv_bytes_per_token(s, Parallel(), "int8") == 61 * (576 + 4 + 128 + 4)
    v3 = shape_from_hf(load_hf_config("DeepSeek-V3"))
    assert kv_bytes_per_token(v3, Parallel(), "bf16") == 61 * 1152
    # the indexer's weights: wq_b 1536 x 64*128 and wk 7168 x 128 quantized, weights_proj bf16
    extra = weight_bytes(s, Parallel(), "int8") - weight_bytes(v3, Parallel(), "int8")
    assert extra == pytest.approx(61 * ((1536 * 8192 + 7168 * 128) * 34 / 32 + 7168 * 64 * 2))


def test_mxfp4_experts_are_17_bytes_per_32_values():
    assert weight_bytes_per_value("mxfp4") == 17 / 32
    s = shape_from_hf(GPT_OSS)
    assert s.expert_weight_dtype == "mxfp4" and s.moe_intermediate_size == 32  # intermediate_size is the expert's
    ops = _by_name(step_ops(s, StepShape(1, 1, 10)))
    experts = ops["experts"]
    assert experts.weight_dtype == "mxfp4" and ops["qkv_proj"].weight_dtype == "bf16"
    acts = 2 * (2 * 64 + 3 * 32) * 2  # 2 token-expert pairs' rows in and out
    assert experts.bytes == pytest.approx(2 * 2 * 3 * 64 * 32 * 17 / 32 + 2 * acts)  # 2 layers, 2 experts read
    # the weights: the experts in MXFP4, everything else as bf16 as with --quantization bf16
    plain = shape_from_hf({k: v for k, v in GPT_OSS.items() if k != "quantization_config"})
    diff = weight_bytes(plain, Parallel(), "bf16") - weight_bytes(s, Parallel(), "bf16")
    assert diff == pytest.approx(2 * 4 * 3 * 64 * 32 * (2 - 17 / 32))
    # --quantization mxfp4 on a model without the key: its experts only, the rest bf16
    flag = _by_name(step_ops(plain, StepShape(1, 1, 10), weight_dtype="mxfp4"))
    assert flag["experts"].weight_dtype == "mxfp4" and flag["qkv_proj"].weight_dtype == "bf16"
    assert weight_bytes(plain, Parallel(), "mxfp4") == pytest.approx(weight_bytes(s, Parallel(), "bf16"))


def test_a_config_without_the_new_keys_is_priced_as_before():
    for hf in (DENSE, MLA):
        s = shape_from_hf(hf)
        assert (s.windows, s.index_topk, s.expert_weight_dtype) == ((), 0, "")
    # Qwen2 checkpoints carry a sliding_window their use_sliding_window switches off; explicit
    # all-full layer_types: both price exactly as the plain config
    step = StepShape(2, 1, 5000)
    plain = step_ops(shape_from_hf(DENSE), step)
    for extra in (
        {"sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 0},
        {"layer_types": ["full_attention"] * 2, "sliding_window": 128},
    ):
        assert step_ops(shape_from_hf({**DENSE, **extra}), step) == plain
    # a window wider than the context prices a sliding layer as a full one, layer for layer
    wide = _by_name(step_ops(shape_from_hf({**GPT_OSS, "sliding_window": 8192}), step))
    assert wide["sliding_attention"].bytes == wide["attention"].bytes
    assert wide["sliding_attention"].flops == wide["attention"].flops


def test_predict_attention_prints_the_cache_and_the_decode_attention():
    buf = io.StringIO()
    argv = ["predict", "--model", "DeepSeek-V3.2-Exp", "--hardware", "ascend-910b", "--input-len", "32768"]
    with contextlib.redirect_stdout(buf):
        assert main([*argv, "--output-len", "1", "--attention"]) == 0
    out = buf.getvalue()
    assert "KV cache    85888 B a token (61 layers x (latent 1152 B + index keys 256 B))" in out
    assert "attention   decode at context 32768:" in out
    assert "    indexer " in out and "    attention_sparse " in out
