"""FLOP and byte counts of tiny dense, MoE and MLA configs against hand arithmetic."""

from __future__ import annotations

import pytest

from tacit.perf_model.dtypes import weight_bytes_per_value
from tacit.perf_model.memory import kv_bytes_per_token, weight_bytes
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import Parallel, StepShape, expected_distinct_experts, step_ops

DENSE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 256,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
}
MLA = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "q_lora_rank": 0,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "intermediate_size": 128,
    "n_routed_experts": 4,
    "num_experts_per_tok": 1,
    "moe_intermediate_size": 16,
    "first_k_dense_replace": 1,
    "vocab_size": 1000,
}


def _by_name(ops):
    return {o.name: o for o in ops}


def test_dense_decode_counts():
    s = shape_from_hf(DENSE)
    assert (s.head_dim, s.num_kv_heads) == (16, 2)
    ops = _by_name(step_ops(s, StepShape(batch=2, new_tokens=1, context=10)))
    # qkv: [2 rows, 64] @ [64, (4 + 2*2) * 16 = 128]: 2*2*64*128 = 32768 FLOPs a layer, 2 layers
    assert ops["qkv_proj"].flops == 2 * 32768
    # weights 64*128*2 bytes = 16384, activations 2 rows * (64 + 128) * 2 = 768, per layer
    assert ops["qkv_proj"].bytes == 2 * (16384 + 768)
    # attention: 4 heads * 16 dims * 4 FLOPs per key, each row sees 11 keys (10 cached + itself)
    assert ops["attention"].flops == 2 * (4 * 4 * 16 * 2 * 11)
    # KV read: 2 seqs * 11 tokens * (K and V) * 2 kv heads * 16 * 2 bytes = 2816; written: 2 rows * 128 = 256;
    # q and output: 2 rows * 2 * 4 * 16 * 2 = 512
    assert ops["attention"].bytes == 2 * (2816 + 256 + 512)
    # MLP: gate+up [64 -> 256] and down [128 -> 64]: 2*2*(64*256 + 128*64) = 98304 a layer
    assert ops["gate_up_proj"].flops + ops["down_proj"].flops == 2 * 98304
    # lm_head over the 2 sampled rows: 2*2*64*1000
    assert ops["lm_head"].flops == 256000


def test_dense_prefill_is_causal():
    s = shape_from_hf(DENSE)
    ops = _by_name(step_ops(s, StepShape(batch=1, new_tokens=4, context=0)))
    # keys seen: 1 + 2 + 3 + 4 = 10
    assert ops["attention"].flops == 2 * (4 * 4 * 16 * 10)


def test_moe_counts_read_expected_distinct_experts():
    s = shape_from_hf(MOE)
    ops = _by_name(step_ops(s, StepShape(batch=3, new_tokens=1, context=0)))
    # 3 tokens, top-2 of 8: 8 * (1 - (6/8)^3) = 8 * (1 - 0.421875) = 4.625 experts read
    assert expected_distinct_experts(8, 2, 3) == pytest.approx(4.625)
    per_expert = 3 * 64 * 32 * 2  # gate, up, down of 64 x 32 in bf16 = 12288 bytes
    acts = 6 * (2 * 64 + 3 * 32) * 2  # 6 token-expert pairs
    assert ops["experts"].bytes == pytest.approx(2 * (4.625 * per_expert + acts))
    # FLOPs follow the 6 active pairs, not the experts read: 2 * 6 * 3 * 64 * 32 per layer
    assert ops["experts"].flops == 2 * (2 * 6 * 3 * 64 * 32)
    # router 64 -> 8 for 3 tokens
    assert ops["router"].flops == 2 * (2 * 3 * 64 * 8)
    assert "gate_up_proj" not in ops  # every layer sparse


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_the_experts_run_as_two_grouped_kernels_a_layer_whatever_they_hit(batch):
    """Every engine priced runs a layer's experts as one grouped GEMM for gate_up and one for
    down: the launches (each a kernel's fixed cost) do not grow with the distinct experts read,
    while the bytes do."""
    s = shape_from_hf(MOE)
    ops = _by_name(step_ops(s, StepShape(batch=batch, new_tokens=1, context=0)))
    assert ops["experts"].launches == 2 * s.num_moe_layers
    one = _by_name(step_ops(s, StepShape(batch=1, new_tokens=1, context=0)))["experts"]
    if batch > 1:
        assert ops["experts"].bytes > one.bytes


def test_mla_absorbed_decode_counts():
    s = shape_from_hf(MLA)
    assert s.is_mla and s.num_dense_layers == 1 and s.num_moe_layers == 0
    ops = _by_name(step_ops(s, StepShape(batch=1, new_tokens=1, context=9)))
    # latent cache: 32 + 8 = 40 values a token, bf16: 10 tokens * 80 bytes read, 80 written
    lat = ops["attention_latent"]
    # scores over the latent + rope (40) and values over the latent (32), 4 heads, 10 keys
    assert lat.flops == 2 * 4 * 40 * 10 + 2 * 4 * 32 * 10
    assert lat.bytes == 10 * 80 + 80 + 1 * 4 * 2 * 32 * 2
    # absorption: q_nope (16) -> latent (32) and latent -> v (16), 4 heads: 2 * 4 * 32 * 32
    assert ops["kv_b_absorbed"].flops == 2 * 4 * 32 * 32
    assert kv_bytes_per_token(s, Parallel(), "bf16") == 80
    # int8 latent: 40 values + a float32 scale
    assert kv_bytes_per_token(s, Parallel(), "int8") == 44


def test_mla_prefill_upprojects_the_latent():
    s = shape_from_hf(MLA)
    ops = _by_name(step_ops(s, StepShape(batch=1, new_tokens=3, context=0)))
    # kv_b_proj on 3 tokens: [3, 32] @ [32, 4 * (16 + 16)]
    assert ops["kv_b_proj"].flops == 2 * 3 * 32 * 128
    # keys seen 1+2+3 = 6: q.k over 24 dims, values over 16, 4 heads
    assert ops["attention"].flops == 2 * 4 * 24 * 6 + 2 * 4 * 16 * 6


def test_weight_bytes_by_dtype():
    assert weight_bytes_per_value("int8") == 34 / 32  # Q8_0
    assert weight_bytes_per_value("int4", 32) == 20 / 32  # Q4_1: 16 bytes of nibbles + fp16 scale and min
    assert weight_bytes_per_value("int4", 128) == 68 / 128
    with pytest.raises(ValueError, match="int4 group size 48"):
        weight_bytes_per_value("int4", 48)
    with pytest.raises(ValueError, match="weight dtype 'int3'.*valid"):
        weight_bytes_per_value("int3")
    s = shape_from_hf(DENSE)
    # 2 layers * (attention 64*128 + 64*64 + MLP 3*64*128) + embeddings and head 2*1000*64, norms 5*64
    params_linear = 2 * (64 * 128 + 64 * 64 + 3 * 64 * 128)
    assert weight_bytes(s, Parallel(), "bf16") == params_linear * 2 + 2 * 1000 * 64 * 2 + 5 * 64 * 2


def test_tensor_parallel_splits_heads_and_adds_all_reduces():
    s = shape_from_hf(DENSE)
    one = _by_name(step_ops(s, StepShape(2, 1, 10)))
    two = _by_name(step_ops(s, StepShape(2, 1, 10), Parallel(tp=2), reduce_bytes=2))
    assert two["qkv_proj"].flops == one["qkv_proj"].flops / 2
    # two all-reduces a layer of 2 rows * 64 * 2 bytes
    assert two["all_reduce"].launches == 4 and two["all_reduce"].bytes == 4 * 256
    assert "all_reduce" not in one


def test_data_parallel_attention_splits_sequences_not_heads():
    """Each of 2 devices attends with all 4 heads over 2 of the 4 sequences: half the latent
    reads of tensor parallelism (every sequence on every device), the same attention FLOPs a
    device, the attention weights whole; the MLP gathers and scatters instead of all-reducing."""
    s = shape_from_hf(MLA)
    step = StepShape(batch=4, new_tokens=1, context=9)
    tp = _by_name(step_ops(s, step, Parallel(tp=2), reduce_bytes=2))
    dp = _by_name(step_ops(s, step, Parallel(tp=2, dp_attention=True), reduce_bytes=2))
    assert dp["attention_latent"].flops == tp["attention_latent"].flops  # 4 heads x 2 seqs = 2 heads x 4
    # latent read (sequences x 10 keys x 80 bytes) + written (rows x 80) + q and out (rows x
    # heads x 2 x 32 x 2 bytes): TP reads all 4 sequences' latents on each device, DP its 2
    assert tp["attention_latent"].bytes == 4 * 10 * 80 + 4 * 80 + 4 * 2 * 2 * 32 * 2
    assert dp["attention_latent"].bytes == 2 * 10 * 80 + 2 * 80 + 2 * 4 * 2 * 32 * 2
    assert dp["o_proj"].flops == 2 * tp["o_proj"].flops / 2  # all heads, half the rows
    assert "all_reduce" not in dp and dp["mlp_all_gather"].bytes == 1 * 4 * 64 * 2
    assert dp["mlp_reduce_scatter"].launches == 2  # the layer's MLP and the embedding
    par = Parallel(tp=2, dp_attention=True)
    assert weight_bytes(s, par, "bf16") > weight_bytes(s, Parallel(tp=2), "bf16")  # attention whole
    dense = shape_from_hf(DENSE)  # GQA: every KV head of a device's own sequences
    assert kv_bytes_per_token(dense, par, "bf16") == 2 * kv_bytes_per_token(dense, Parallel(tp=2), "bf16")


def test_data_parallel_attention_memory_holds_a_share_of_the_sequences():
    from tacit.perf_model.memory import device_memory

    s = shape_from_hf(MLA)
    tp = device_memory(s, Parallel(tp=4), "bf16", "bf16", batch=8, input_len=100, output_len=28)
    dp = device_memory(s, Parallel(tp=4, dp_attention=True), "bf16", "bf16", batch=8, input_len=100, output_len=28)
    assert tp.kv_cache == 8 * 128 * 80 and dp.kv_cache == 2 * 128 * 80
    odd = device_memory(s, Parallel(tp=4, dp_attention=True), "bf16", "bf16", batch=5, input_len=100, output_len=28)
    assert odd.kv_cache == 2 * 128 * 80  # the busiest device holds ceil(5 / 4) sequences


def test_elementwise_and_sampler_bytes():
    s = shape_from_hf(MOE)  # Qwen3-MoE: per-head q/k norms
    ops = _by_name(step_ops(s, StepShape(batch=2, new_tokens=1, context=10)))
    # per layer and row: 2 norms * 2 passes * 64 + 2 adds * 3 passes * 64 = 640; SiLU*up over
    # k * moe width = 2 * 32 = 64 values, 3 passes: 192; RoPE + q/k norms over (4 + 2) heads * 16
    # = 96 values, 2 passes each: 384. (640 + 192 + 384) * 2 bytes = 2432 per row, 2 rows: 4864
    ew = ops["norms_residual_act"]
    assert ew.working_set == 4864
    # 2 layers, plus embedding and final norm: 3 passes * 2 rows * 64 * 2 bytes = 768
    assert ew.bytes == 2 * 4864 + 768
    # greedy sampler: 2 rows * 1000 entries * (2 + 4 + 4) bytes
    assert ops["sampler"].bytes == 20000 and ops["sampler"].rows == 2
    # the router is a bf16 GEMM (its curve), its time counted as routing
    assert ops["router"].is_gemm and ops["router"].op_class == "moe_routing"
    assert not ops["dispatch_combine"].is_gemm
    # dispatch + combine per layer: 2 rows * k=2 * 64 * 2 bytes, there and back
    assert ops["dispatch_combine"].working_set == 2 * 2 * 2 * 64 * 2


@pytest.mark.parametrize("name, params", [("gpt-oss-20b", 20.91e9), ("gpt-oss-120b", 116.83e9)])
def test_gpt_oss_weights_are_the_model_cards_parameters(name, params):
    """gpt-oss's experts are intermediate_size wide (it has no moe_intermediate_size): with its
    experts in bf16, 2 bytes a parameter of OpenAI's model card (arXiv 2508.10925, table 1:
    20.91B and 116.83B), within the biases and sinks the count leaves out. As shipped (MXFP4
    experts, 17 bytes a 32 values) the experts take 17/64 of that."""
    from dataclasses import replace

    from tacit.perf_model.model_shape import load_hf_config

    shipped = shape_from_hf(load_hf_config(name))
    assert shipped.expert_weight_dtype == "mxfp4"
    s = replace(shipped, expert_weight_dtype="")
    assert s.moe_intermediate_size == 2880 and s.num_moe_layers == s.num_layers
    assert weight_bytes(s, Parallel(), "bf16") == pytest.approx(2 * params, rel=0.005)
    experts = s.num_moe_layers * s.num_experts * 3 * s.hidden_size * s.moe_intermediate_size
    saved = experts * (2 - 17 / 32)
    assert weight_bytes(shipped, Parallel(), "bf16") == pytest.approx(weight_bytes(s, Parallel(), "bf16") - saved)
