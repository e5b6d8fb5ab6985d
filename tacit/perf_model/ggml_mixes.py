"""llama.cpp's GGML block types (bytes per value from their block layouts) and its file types
that mix them per tensor (Q4_K_M keeps some tensors at Q6_K).

Block layouts: ggml/src/ggml-common.h (block_q4_0 ... block_iq4_xs, each with a static_assert on
its size; ik_llama.cpp's ggml-common.h for its IQ2_KL); the mixes: src/llama-quant.cpp, llama_tensor_get_type_impl (ggml-org/llama.cpp).
"""

from __future__ import annotations

QK_K = 256  # values of a k-quant super-block

# (bytes of one block, values it holds), from the structs of ggml-common.h; fp16 = 2 bytes
GGML_BLOCKS = {
    "q8_0": (2 + 32, 32),  # fp16 d, 32 int8
    "q4_0": (2 + 16, 32),  # fp16 d, 32 nibbles
    "q4_1": (2 * 2 + 16, 32),  # fp16 d and m, 32 nibbles
    "q5_0": (2 + 4 + 16, 32),  # fp16 d, 32 high bits, 32 nibbles
    "q5_1": (2 * 2 + 4 + 16, 32),  # fp16 d and m, 32 high bits, 32 nibbles
    "q2_k": (QK_K // 16 + QK_K // 4 + 2 * 2, QK_K),  # 4-bit scales/mins a 16, 2-bit quants, fp16 d, dmin
    "q3_k": (QK_K // 8 + QK_K // 4 + 12 + 2, QK_K),  # high-bit mask, low 2 bits, 6-bit scales, fp16 d
    "q4_k": (2 * 2 + 12 + QK_K // 2, QK_K),  # fp16 d, dmin, 6-bit scales and mins (12 B), nibbles: 144
    "q5_k": (2 * 2 + 12 + QK_K // 8 + QK_K // 2, QK_K),  # q4_k and a high bit a value: 176
    "q6_k": (QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, QK_K),  # low 4 bits, high 2, int8 scales a 16, d: 210
    "iq4_xs": (2 + 2 + QK_K // 64 + QK_K // 2, QK_K),  # fp16 d, scales_h, scales_l, nibbles: 136
    "iq4_nl": (2 + 16, 32),  # fp16 d, 32 nibbles into a non-linear table
    # the codebook types: groups of 8 values as indices into a shared grid, with sign bits
    "iq3_s": (2 + QK_K // 4 + QK_K // 32 + QK_K // 8 + QK_K // 64, QK_K),  # d, qs, qh, signs, scales: 110
    "iq3_xxs": (2 + 3 * QK_K // 8, QK_K),  # fp16 d, grid indices, signs and scales: 98
    "iq2_s": (2 + QK_K // 4 + QK_K // 32 + QK_K // 32, QK_K),  # fp16 d, qs, qh, scales: 82
    "iq2_xs": (2 + 2 * (QK_K // 8) + QK_K // 32, QK_K),  # fp16 d, uint16 qs, scales: 74
    "iq2_xxs": (2 + 2 * (QK_K // 8), QK_K),  # fp16 d, uint16 qs (indices, signs, scales): 66
    "iq1_m": (QK_K // 8 + QK_K // 16 + QK_K // 32, QK_K),  # qs, qh, scales (the fp16 d spread in them): 56
    "iq1_s": (2 + QK_K // 8 + 2 * (QK_K // 32), QK_K),  # fp16 d, qs, uint16 qh: 50
    "tq2_0": (QK_K // 4 + 2, QK_K),  # ternary, 2 bits a value, fp16 d: 66
    "tq1_0": ((QK_K - 4 * QK_K // 64) // 5 + QK_K // 64 + 2, QK_K),  # ternary, 5 a byte, 4 a byte, d: 54
    # ik_llama.cpp's IQ2_KL (ikawrakow/ik_llama.cpp#602, "a 2.6875 bpw quantization type"):
    # scales_h, scales_l, 2-bit quants, a high bit a pair: 86 bytes, and an fp16 scale a row
    # (2 bytes a 7,168-value row: 0.03%, left out); it exists in no mainline llama.cpp file
    "iq2_kl": (2 + QK_K // 64 + QK_K // 4 + QK_K // 16, QK_K),
}

# File types (llama-quantize's names) that mix block types by tensor role: their default type,
# and per role either a type or (a type on use_more_bits layers, the default elsewhere).
# Roles as llama-quant.cpp names the tensor categories: attn_v covers attn_v, a fused attn_qkv
# and MLA's attn_kv_b (category_is_attn_v); output is the lm_head (a tied one is the embedding).
# Every type but q8_0 stores output.weight at Q6_K ("else if (new_type != GGML_TYPE_Q8_0)
# new_type = GGML_TYPE_Q6_K"). Rules for 8-expert models (Mixtral: attn_v/attn_k at Q8_0) and
# Falcon are not modelled; q2_k's attn_v is Q4_K only at n_gqa >= 4, taken here as the GQA case.
MORE_BITS = "more_bits"
GGML_MIXES = {
    "q4_k_m": {"default": "q4_k", "attn_v": ("q6_k", MORE_BITS), "ffn_down": ("q6_k", MORE_BITS)},
    "q5_k_m": {"default": "q5_k", "attn_v": ("q6_k", MORE_BITS), "ffn_down": ("q6_k", MORE_BITS)},
    # Q3_K_M: attn_v Q5_K on the first 2 layers and Q4_K after; ffn_down Q5_K on the first
    # n/16 layers and Q4_K after (non-Falcon); attn_output Q4_K
    "q3_k_m": {
        "default": "q3_k",
        "attn_v": ("q5_k", "first_2", "q4_k"),
        "ffn_down": ("q5_k", "first_16th", "q4_k"),
        "attn_output": "q4_k",
    },
    # Q2_K: attn_v Q4_K (n_gqa >= 4), ffn_down and attn_output Q3_K
    "q2_k": {"default": "q2_k", "attn_v": "q4_k", "ffn_down": "q3_k", "attn_output": "q3_k"},
}
GGML_TYPES = tuple(GGML_BLOCKS) + tuple(GGML_MIXES)
# The role of each of the operator model's GEMMs (operators.py, attention_ops.py) in the mixes;
# unlisted ones take the default type. The fused qkv_proj is priced at the default type: in
# llama.cpp's files attn_q, attn_k and attn_v are separate and only attn_v (hkv / (hq + 2 hkv)
# of the fused weight: 1/6 for Llama-3-8B) takes Q6_K on the use_more_bits layers, about 0.3%
# of a layer's bytes left out.
GEMM_ROLES = {
    "o_proj": "attn_output",
    "down_proj": "ffn_down",
    "shared_down": "ffn_down",
    "kv_b_proj": "attn_v",
    "kv_b_absorbed": "attn_v",
    "lm_head": "output",
}


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of the layers and every third
    one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer_type(rule: str | tuple, default: str, i: int, n: int) -> str:
    if isinstance(rule, str):
        return rule
    more, when, *rest = rule
    other = rest[0] if rest else default
    chosen = {MORE_BITS: use_more_bits(i, n), "first_2": i < 2, "first_16th": i < n // 16}[when]
    return more if chosen else other


def block_bytes_per_value(gtype: str) -> float:
    nbytes, values = GGML_BLOCKS[gtype]
    return nbytes / values


def ggml_tensor_types(ftype: str, role: str, layers: int) -> list[str]:
    """The block type of each of `layers` tensors of `role` in a file of type `ftype`."""
    if role == "output":
        return ["q8_0" if ftype == "q8_0" else "q6_k"] * max(layers, 1)
    if ftype not in GGML_MIXES:  # a block type; "q2_k" names llama-quantize's Q2_K mix, not the block
        return [ftype] * max(layers, 1)
    mix = GGML_MIXES[ftype]
    rule = mix.get(role, mix["default"])
    return [_layer_type(rule, mix["default"], i, layers) for i in range(max(layers, 1))]


def ggml_bytes_per_value(ftype: str, role: str, layers: int) -> float:
    """Mean bytes per value of `role`'s tensors over `layers` layers (the model's share of Q6_K
    layers: 16 of 32 for Llama-3-8B's ffn_down in Q4_K_M)."""
    types = ggml_tensor_types(ftype, role, layers)
    return sum(block_bytes_per_value(t) for t in types) / len(types)
