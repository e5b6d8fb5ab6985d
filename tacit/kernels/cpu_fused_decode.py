"""A decode step as one C++ call on CPU (csrc/fused_decode.cpp's FusedDecoder): GQA layers
(the Llama family, Qwen3-MoE) or MLA layers (DeepSeek-V3, Kimi-K2).

The torch path runs a batch-1 decode step of SmolLM2-135M as ~1,500 small ops; their
dispatch (~15 ms) cost more than streaming the weights (~9 ms). The fused decoder keeps the
weights and KV caches the torch model already owns (no copy), takes the step's token ids,
positions and block tables, and returns the final-normed hidden states; the model runner
projects and samples them as usual. It runs every step in which each request brings one
token (decode-only steps, however many rows), and the one-token rows of mixed steps, whose
prefill chunks take the torch path (the work there is in large GEMMs and the dispatch
overhead is small beside it; see ModelRunner._splits_mixed_step).

This file knows tensors only: the model family's binder (worker/paths/fused_binders/) checks
a model fits and hands its weights over as DecoderLayerWeights or MLALayerWeights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

from tacit.kernels.ggml_quant import BF16
from tacit.kernels.moe_kernel import ExpertWeights


@dataclass
class DecoderLayerWeights:
    """One dense pre-norm decoder layer: [out, in] bf16 matrices, q/k/v and gate/up stacked.

    A projection whose type is a GGML type id (kernels/ggml_quant.GGML_TYPES) is instead that
    type's uint8 [out, in / 32 * block_bytes] blocks; BF16 (30) marks a bf16 matrix. qkv and
    gate_up are lists of parts with a type each: one part, or one per shard where the shards
    mix GGML types (layers/ggml_linear_method.weight_parts)."""

    input_norm: torch.Tensor
    qkv: list[torch.Tensor]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # per-head q/k RMSNorm (Qwen3), or None
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor
    o_bias: torch.Tensor | None
    post_attention_norm: torch.Tensor
    gate_up: list[torch.Tensor] | None  # None for a sparse MoE layer (moe below)
    down: torch.Tensor | None
    # [2, num_blocks, block_size, Hkv, D] bf16, the torch paged backend's layout, or int8 with
    # D + 4 (kernels/kv_quant.py's rows: values, then their fp32 scale).
    kv_cache: torch.Tensor
    qkv_types: list[int] = field(default_factory=lambda: [BF16])
    o_type: int = BF16
    gate_up_types: list[int] = field(default_factory=lambda: [BF16])
    down_type: int = BF16
    moe: MoELayerWeights | None = None


@dataclass
class MoELayerWeights:
    """A sparse MoE MLP with softmax top-k routing (Qwen3-MoE): router bf16 [E, hidden], experts as
    kernels/moe_kernel.ExpertWeights holds them (BF16 or a GGML type id per stack)."""

    router: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor
    w13_type: int
    w2_type: int
    top_k: int
    renormalize: bool
    # Streamed experts: (expert ids [m, top_k], normed rows [m, hidden]) -> the expert -> slot
    # table of the cache that w13/w2 are (the call makes those experts resident).
    expert_slots: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def bind_gqa_decoder(
    kernels: ModuleType,
    embed: torch.Tensor,
    embed_type: int,
    hidden: int,
    final_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate: int,
    eps: float,
    scale: float,
    block_size: int,
    layers: list[DecoderLayerWeights],
) -> Any:
    """The C++ FusedDecoder over a GQA model's tensors (shared, not copied); cos/sin [max_positions, D/2]
    for every position; embed bf16 [vocab, hidden] (embed_type BF16) or a GGML type's blocks.
    Raises ValueError/RuntimeError for a shape the kernel does not take."""
    decoder = kernels.FusedDecoder(
        embed,
        embed_type,
        hidden,
        final_norm,
        cos.contiguous(),
        sin.contiguous(),
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate,
        eps,
        scale,
        block_size,
    )
    for w in layers:
        decoder.add_layer(
            w.input_norm,
            w.qkv,
            w.qkv_bias,
            w.q_norm,
            w.k_norm,
            w.o_proj,
            w.o_bias,
            w.post_attention_norm,
            w.gate_up,
            w.down,
            w.kv_cache,
            w.qkv_types,
            w.o_type,
            w.gate_up_types,
            w.down_type,
        )
        if w.moe is not None:
            m = w.moe
            decoder.add_moe(m.router, m.w13, m.w13_type, m.w2, m.w2_type, m.top_k, m.renormalize, m.expert_slots)
    return decoder


@dataclass
class GroupedMoEWeights:
    """DeepSeek-V3's MoE MLP: float32 router [E, hidden] and correction bias [E], sigmoid scores,
    group-limited top-k, scaled; the routed stacks and the shared expert (a stack of one, or None)."""

    router: torch.Tensor
    correction_bias: torch.Tensor
    routed: ExpertWeights
    shared: ExpertWeights | None
    top_k: int
    renormalize: bool
    groups: int
    topk_groups: int
    scaling: float
    # An expert-parallel rank's expert -> slot table callback (MoELayerWeights.expert_slots).
    expert_slots: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


@dataclass
class MLALayerWeights:
    """One MLA decoder layer (DeepSeek-V3, Kimi-K2): q_a/q_a_norm None for a plain q_proj (in
    q_b); w_uk [H, nope, rank] and w_uv_t [H, rank, v] absorbed from kv_b_proj; the latent cache
    [blocks, block_size, rank + rope] bf16 or kv_quant.py's int8 rows. The MLP: dense gate_up/down,
    or moe."""

    input_norm: torch.Tensor
    q_a: torch.Tensor | None
    q_a_type: int
    q_a_norm: torch.Tensor | None
    q_b: torch.Tensor
    q_b_type: int
    kv_a: torch.Tensor
    kv_a_type: int
    kv_a_norm: torch.Tensor
    w_uk: torch.Tensor
    w_uv_t: torch.Tensor
    o_proj: torch.Tensor
    o_type: int
    post_attention_norm: torch.Tensor
    latent_cache: torch.Tensor
    head_bmm: bool  # the absorbed products through csrc/head_bmm.cpp, as the torch path picks
    gate_up: list[torch.Tensor] | None = None
    down: torch.Tensor | None = None
    gate_up_types: list[int] = field(default_factory=lambda: [BF16])
    down_type: int = BF16
    moe: GroupedMoEWeights | None = None


def _stack(e: ExpertWeights) -> tuple[torch.Tensor, int, torch.Tensor, int]:
    """(w13, its type, w2, its type) as the C++ decoder takes a stack: BF16 for a bf16 one."""
    return e.w13, BF16 if e.w13_type is None else e.w13_type, e.w2, BF16 if e.w2_type is None else e.w2_type


def bind_mla_decoder(
    kernels: ModuleType,
    embed: torch.Tensor,
    embed_type: int,
    final_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    intermediate: int,
    eps: float,
    scale: float,
    block_size: int,
    layers: list[MLALayerWeights],
) -> Any:
    """The C++ FusedDecoder over an MLA model's tensors (shared, not copied): its MLA layers
    (csrc/fused_decode.cpp mla_attention) and grouped-routing MoE. cos/sin [max_positions, rope
    / 2]: the decoder's head_dim is the rotary width, its one kv head the latent."""
    rope = cos.shape[1] * 2
    decoder = kernels.FusedDecoder(
        embed,
        embed_type,
        final_norm.shape[0],
        final_norm,
        cos.contiguous(),
        sin.contiguous(),
        num_heads,
        1,
        rope,
        intermediate,
        eps,
        scale,
        block_size,
    )
    empty = torch.empty(0)
    for w in layers:
        decoder.add_mla_layer(
            w.input_norm,
            w.q_a,
            w.q_a_type,
            w.q_a_norm,
            w.q_b,
            w.q_b_type,
            w.kv_a,
            w.kv_a_type,
            w.kv_a_norm,
            w.w_uk,
            w.w_uv_t,
            w.o_proj,
            w.o_type,
            w.post_attention_norm,
            w.gate_up,
            w.down,
            w.gate_up_types,
            w.down_type,
            w.latent_cache,
            w.head_bmm,
        )
        if w.moe is not None:
            m, shared = w.moe, w.moe.shared or ExpertWeights(empty, empty)
            routing = (m.top_k, m.renormalize, m.groups, m.topk_groups, m.scaling)
            decoder.add_grouped_moe(
                m.router, m.correction_bias, *_stack(m.routed), *routing, *_stack(shared), m.expert_slots
            )
    return decoder


class ShardedDecoder:
    """A tensor-parallel rank's fused decoder: its layers hold the rank's heads and features and
    all-reduce in C++ (FusedDecoder.set_all_reduce); the token embedding is the rank's slice of
    the vocabulary, looked up by the model's vocab-parallel table (which all-reduces itself).
    data_parallel: the attention is whole and runs this rank's own rows, the MLPs every rank's
    (set_data_parallel_rows before each step; the embedding reads the forward context)."""

    def __init__(
        self, decoder: Any, embed: Callable[[torch.Tensor], torch.Tensor], data_parallel: bool = False
    ) -> None:
        self.decoder, self._embed = decoder, embed
        self.num_layers = decoder.num_layers
        self.data_parallel = data_parallel

    def set_data_parallel_rows(self, offset: int, total: int) -> None:
        """This step's rows of this rank begin at `offset` among every rank's `total`."""
        self.decoder.set_data_parallel_rows(offset, total)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._embed(token_ids).to(torch.bfloat16).contiguous()

    def run_layers(self, x: torch.Tensor, positions: torch.Tensor, tables: torch.Tensor, begin: int, end: int) -> None:
        self.decoder.run_layers(x, positions, tables, begin, end)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder.final_norm(x)

    @property
    def all_reduce_seconds(self) -> float:
        """Seconds this rank spent in the C++ all-reduces (waiting for the other ranks included)."""
        return self.decoder.all_reduce_seconds

    def set_ggml_int8_activations(self, on: bool) -> None:
        """How the GGML GEMVs multiply (FusedDecoder.set_ggml_int8_activations)."""
        self.decoder.set_ggml_int8_activations(on)

    def set_phase_timing(self, on: bool) -> None:
        """Per-layer per-phase timers (FusedDecoder.set_phase_timing): off unless profiling."""
        self.decoder.set_phase_timing(on)

    @property
    def phase_names(self) -> list[str]:
        return self.decoder.phase_names

    @property
    def phase_seconds(self) -> list[float]:
        """Seconds per [layer * len(phase_names) + phase] since set_phase_timing(True)."""
        return self.decoder.phase_seconds

    def communication_seconds(self) -> dict[str, float]:
        """{"fused.layers.{i}.self_attn" / ".mlp": seconds} of the all-reduce after each; under
        data-parallel attention ".mlp_gather" (the rows gathered before the MLP) and ".mlp"."""
        per = self.decoder.all_reduce_seconds_per_layer
        first = "mlp_gather" if self.data_parallel else "self_attn"
        return {f"fused.layers.{i // 2}.{'mlp' if i % 2 else first}": s for i, s in enumerate(per)}
