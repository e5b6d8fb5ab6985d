"""Bytes one device holds: weights (its shard), the KV cache of the batch at full length, and
the largest step's activations."""

from __future__ import annotations

from dataclasses import dataclass

from tacit.perf_model.dtypes import kv_bytes_per_row, weight_bytes_per_value
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.operators import ACT, Parallel


@dataclass(frozen=True)
class Memory:
    weights: float
    kv_cache: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations


def weight_bytes(s: ModelShape, par: Parallel, wdt: str, group: int = 32) -> float:
    """Per device. Quantized: the linear layers and experts (tacit's --quantization set); kept
    bf16: embeddings, lm_head, norms, MoE routers, MLA's kv_b_proj."""
    q, n, h = weight_bytes_per_value(wdt, group), par.tp, s.hidden_size
    L, na = s.num_layers, par.attention_tp  # attention whole on each device under DP attention
    if s.is_mla:
        hq = max(1, s.num_heads // na)
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        q_params = s.q_lora_rank * (h + hq * qk) if s.q_lora_rank else h * hq * qk
        attn = q_params + h * (s.kv_lora_rank + s.qk_rope_head_dim) + hq * s.v_head_dim * h
        kept = s.kv_lora_rank * hq * (s.qk_nope_head_dim + s.v_head_dim)
    else:
        hq, hkv = max(1, s.num_heads // na), max(1, s.num_kv_heads // na)
        attn = h * (hq + 2 * hkv) * s.head_dim + hq * s.head_dim * h
        kept = 0
    dense_layers = s.num_dense_layers if s.is_moe else L
    total = L * (attn * q + kept * 2) + dense_layers * 3 * h * (s.intermediate_size // n) * q
    if s.is_moe:
        experts = s.num_experts * 3 * h * s.moe_intermediate_size / n  # EP: E/N whole; TP: all, 1/N wide
        shared = s.num_shared_experts * 3 * h * s.moe_intermediate_size / n
        total += s.num_moe_layers * ((experts + shared) * q + h * s.num_experts * 2)
    vocab = s.vocab_size * h / n * 2
    total += vocab * (1 if s.tie_word_embeddings else 2)  # embedding and lm_head, vocab-parallel
    total += (2 * L + 1) * h * 2  # norms
    return total


def kv_bytes_per_token(s: ModelShape, par: Parallel, kvdt: str) -> float:
    """Every layer's cache row for one token on the device that holds it (MLA: the whole latent;
    under data-parallel attention, every KV head of the device's own sequences)."""
    if s.is_mla:
        return s.num_layers * kv_bytes_per_row(kvdt, s.kv_lora_rank + s.qk_rope_head_dim)
    hkv = max(1, s.num_kv_heads // par.attention_tp)
    return s.num_layers * 2 * hkv * kv_bytes_per_row(kvdt, s.head_dim)


def device_memory(
    s: ModelShape, par: Parallel, wdt: str, kvdt: str, batch: int, input_len: int, output_len: int, group: int = 32
) -> Memory:
    # Under data-parallel attention a device holds only its own sequences' KV.
    kv = par.sequences_per_device(batch) * (input_len + output_len) * kv_bytes_per_token(s, par, kvdt)
    # the prefill of the whole batch is the widest step: hidden state, q/k/v, the MLP's widest
    # intermediate (MoE: every token's k expert rows), and float32 logits of the sampled rows
    tokens = batch * input_len
    width = s.top_k * s.moe_intermediate_size if s.is_moe else s.intermediate_size / par.tp
    per_token = (4 * s.hidden_size + 3 * s.num_heads * s.head_dim / par.tp + 2 * width) * ACT
    acts = tokens * per_token + batch * s.vocab_size * 4
    return Memory(weight_bytes(s, par, wdt, group), kv, acts)
