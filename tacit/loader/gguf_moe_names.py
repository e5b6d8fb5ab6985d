"""Tensor names of llama.cpp's MoE (`qwen3moe`, `deepseek2`) layouts against Hugging Face's.

One table for both directions: the GGUF writer maps HF names to these, the GGUF loader back.
Names that are not one tensor to one tensor (stacked experts, MLA's split kv_b, the router's
correction bias, which HF names without a .weight/.bias suffix) are listed apart, each with the
code that handles it in gguf_moe_export.py / gguf_moe_import.py.
"""

from __future__ import annotations

# HF module inside a decoder layer -> llama.cpp tensor (the .weight/.bias suffix carries over).
MOE_LAYER = {
    "mlp.gate": "ffn_gate_inp",  # the router
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    # Older deepseek2 files keep kv_b whole; llama.cpp's converter now writes attn_k_b + attn_v_b.
    "self_attn.kv_b_proj": "attn_kv_b",
}

# HF expert projection -> llama.cpp's [experts, rows, cols] stack of it.
EXPERT_STACKS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}

# DeepSeek-V3's routing bias (noaux_tc): HF `mlp.gate.e_score_correction_bias`, GGUF `exp_probs_b.bias`.
ROUTER_BIAS_HF = "mlp.gate.e_score_correction_bias"
ROUTER_BIAS_GGUF = "exp_probs_b.bias"

# MLA's kv_b_proj split per head, as llama.cpp absorbs it: k_b [heads, kv_lora_rank, nope]
# (each head's K part transposed), v_b [heads, v_head_dim, kv_lora_rank].
K_B, V_B = "attn_k_b", "attn_v_b"
