"""Bytes one device holds: weights (its shard), the KV cache of the batch at full length, and
the largest step's activations. Each part splits as Parallel says: attention over the attention
group, dense MLPs over the dense group, experts ceil((E + R) / EP) whole a device and 1/expert_tp
wide, the embedding and head over the head group; a pipeline stage holds ceil(L / P) layers and
the larger of the embedding and the head (the first stage holds one, the last the other)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tacit.config.cache import CacheConfig
from tacit.kv_cache_interface import sliding_peak_blocks
from tacit.perf_model.dtypes import kv_bytes_per_row, weight_bytes_per_value
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.moe_dispatch import busiest_pairs, expert_slots
from tacit.perf_model.op_types import ACT, Parallel, StepShape


@dataclass(frozen=True)
class Memory:
    weights: float
    kv_cache: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations


def weight_bytes(s: ModelShape, par: Parallel, wdt: str, group: int = 32) -> float:
    """Per device, each tensor in its own format (ModelShape.tensor_dtypes): the linear layers and
    experts in `wdt`, a GGML mix's attn_output / ffn_down / attn_v in their role's types; the
    lm_head, embedding and MLA's kv_b_proj as the checkpoint stores them; norms, MoE routers and
    DSA's weights_proj bf16. Each part split as the layout splits it, on the busiest pipeline stage."""
    dts = s.tensor_dtypes(wdt)
    expert_dt, wdt = dts.experts, dts.linear
    L, na = s.num_layers, par.attention_tp  # attention whole on each device under DP attention

    def bpv(dtype: str, role: str = "", layers: int = L) -> float:
        return weight_bytes_per_value(dtype, group, role, layers)

    q, h = bpv(wdt), s.hidden_size
    unquantized = 4 if wdt == "fp32" else 2  # bytes of a norm or router value: bf16, fp32 in an fp32 engine
    if s.is_mla:
        hq = max(1, s.num_heads // na)
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        q_params = s.q_lora_rank * (h + hq * qk) if s.q_lora_rank else h * hq * qk
        attn = (
            q_params * q
            + h * (s.kv_lora_rank + s.qk_rope_head_dim) * q
            + hq * s.v_head_dim * h * bpv(wdt, "attn_output")
        )
        attn += s.kv_lora_rank * hq * (s.qk_nope_head_dim + s.v_head_dim) * bpv(dts.kv_b, "attn_v")
        if s.is_dsa:  # the indexer's wq_b and wk (quantized as the checkpoint's fp8 are), weights_proj bf16
            attn += (s.index_n_heads * s.index_head_dim * (s.q_lora_rank or h) + h * s.index_head_dim) * q
            attn += h * s.index_n_heads * 2
    else:
        hq, hkv = max(1, s.num_heads // na), max(1, s.num_kv_heads // na)
        attn = h * (hq + 2 * hkv) * s.head_dim * q + hq * s.head_dim * h * bpv(wdt, "attn_output")
    dense_layers = s.num_dense_layers if s.is_moe else L
    dense_inter = h * (s.intermediate_size // par.dense_group)
    total = L * attn + dense_layers * dense_inter * (2 * q + bpv(wdt, "ffn_down", dense_layers))
    if s.is_moe:
        if par.ep:  # the busiest rank's whole experts, 1/expert_tp of their width
            experts = expert_slots(s, par)[0] * h * s.moe_intermediate_size / par.expert_tp
        else:  # every expert, 1/N of its width over the stage's devices
            experts = s.num_experts * h * s.moe_intermediate_size / par.stage_devices
        shared_split = 1 if par.backend == "deepep" else par.dense_group  # DeepEP: whole on each device
        shared = s.num_shared_experts * h * s.moe_intermediate_size / shared_split
        Lm = s.num_moe_layers
        qe = 2 * bpv(expert_dt, "", Lm) + bpv(expert_dt, "ffn_down", Lm)  # gate, up; down
        total += Lm * ((experts + shared) * qe + h * s.num_experts * unquantized)  # experts, router
    total += (2 * L + 1) * h * unquantized  # norms
    total *= stage_share(s, par)
    vocab = s.vocab_size * h / par.head_group  # embedding and lm_head, vocab-parallel
    head = vocab * bpv(dts.head, "output", 1)
    embedding = head if s.tie_word_embeddings else vocab * bpv(dts.embedding, "", 1)  # tied: one table
    if par.pp > 1:  # the first stage holds the embedding, the last the head: the busier one of them
        return total + max(head, embedding)
    return total + (head if s.tie_word_embeddings else head + embedding)


def stage_share(s: ModelShape, par: Parallel) -> float:
    """The busiest pipeline stage's share of the layers: ceil(L / P) of L."""
    return math.ceil(s.num_layers / par.pp) / s.num_layers


def kv_row_bytes(s: ModelShape, par: Parallel, kvdt: str) -> tuple[float, float]:
    """One layer's cache bytes for one token on the device that holds it: (the attention cache,
    DSA's index-key cache). MLA: the whole latent; under data-parallel attention, every KV head
    of the device's own sequences. DSA: one index_head_dim row (bf16 128 values: 256 B; int8:
    the 128 values and a float32 scale, kv_bytes_per_row)."""
    index = kv_bytes_per_row(kvdt, s.index_head_dim) if s.is_dsa else 0.0
    if s.is_mla:
        return kv_bytes_per_row(kvdt, s.kv_lora_rank + s.qk_rope_head_dim), index
    hkv = max(1, s.num_kv_heads // par.attention_tp)
    return 2 * hkv * kv_bytes_per_row(kvdt, s.head_dim), index


def kv_bytes_per_token(s: ModelShape, par: Parallel, kvdt: str) -> float:
    """Every layer's cache row for one token, as a full-attention layer keeps each token (a
    sliding layer keeps only its window's: kv_bytes_per_sequence)."""
    return s.num_layers * sum(kv_row_bytes(s, par, kvdt))


def sliding_held_tokens(window: int, tokens: int, block_size: int = CacheConfig.block_size, chunk: int = 1) -> int:
    """Tokens a sliding layer of `window` holds for a request of `tokens` while a step computes
    `chunk` of them: the blocks the hybrid KV cache keeps at most (kv_cache_interface's
    sliding_peak_blocks), never more than the request's blocks."""
    return min(-(-tokens // block_size), sliding_peak_blocks(window, block_size, chunk)) * block_size


def kv_bytes_per_sequence(s: ModelShape, par: Parallel, kvdt: str, tokens: int) -> float:
    """One request's cache at `tokens` tokens, decoding: a full layer holds every token, a
    sliding one the blocks its window reaches (sliding_held_tokens: a 128-token window in
    16-token blocks, 144 tokens)."""
    row = sum(kv_row_bytes(s, par, kvdt))
    return sum(
        n * row * (tokens if not w else min(tokens, sliding_held_tokens(w, tokens))) for w, n in s.layer_counts.items()
    )


def device_memory(
    s: ModelShape, par: Parallel, wdt: str, kvdt: str, batch: int, input_len: int, output_len: int, group: int = 32
) -> Memory:
    # Under data-parallel attention a device holds only its own sequences' KV.
    seqs = par.sequences_per_device(batch)
    kv = seqs * kv_bytes_per_sequence(s, par, kvdt, input_len + output_len) * stage_share(s, par)
    # the prefill of the whole batch is the widest step: hidden state, q/k/v, the MLP's widest
    # intermediate (MoE: every token's k expert rows), and float32 logits of the sampled rows.
    # Under DeepEP a device holds its own tokens and the expert rows it computes (the busiest's).
    tokens = batch * input_len
    width = s.top_k * s.moe_intermediate_size if s.is_moe else s.intermediate_size / par.tp
    heads = s.num_heads * s.head_dim / par.tp
    logit_rows = seqs if par.dp_lm_head else batch
    if s.is_moe and par.backend == "deepep":
        step = StepShape(batch, input_len, 0)
        tokens = par.own_tokens(step)
        pairs = busiest_pairs(s, step, par, batch * s.sequence_draws(input_len))
        width = pairs * s.moe_intermediate_size / par.expert_tp / max(tokens, 1e-9)
        heads, logit_rows = s.num_heads * s.head_dim, seqs
    per_token = (4 * s.hidden_size + 3 * heads + 2 * width) * ACT
    acts = tokens * per_token + logit_rows * s.vocab_size * 4
    return Memory(weight_bytes(s, par, wdt, group), kv, acts)
