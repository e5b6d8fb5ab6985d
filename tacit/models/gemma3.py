"""Gemma 3 text models (Gemma3ForCausalLM, config model_type "gemma3_text"): Llama's stack with
Gemma's changes.

- Five sliding-window layers to one global (`layer_types`, or the older `sliding_window_pattern`):
  a sliding layer attends to each query's last `sliding_window` positions (512 for the 1B, 1024
  for the larger ones) and declares a SlidingWindowSpec for its cache.
- Two rope bases: `rope_local_base_freq` (10k) on sliding layers, `rope_theta` (1M) with the
  config's scaling (linear x8 on the 4B and larger) on global layers. transformers 5 writes them
  as `rope_parameters` per layer type; older configs as the flat keys. Both are read.
- GemmaRMSNorm (x * (1 + w)) everywhere: before and after attention, before and after the MLP,
  and on each head's q and k.
- scale = query_pre_attn_scalar ** -0.5 (168 for the 27B, where head_dim is 128), not head_dim's.
- The MLP gates with GELU (tanh approximation) instead of SiLU.
- The embedding is multiplied by sqrt(hidden_size), rounded to the model's dtype first as
  transformers does (sqrt(3072) = 55.43 is 55.5 in bf16); the head is tied to it.
- final_logit_softcapping, where set, caps the logits with tanh (Gemma 3's checkpoints leave it unset).

Weight names are Hugging Face's; the 4B-27B's multimodal checkpoints load their decoder as this
(loader/multimodal.py). Decode steps run on the torch path: no C++ step is bound to
this architecture.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generator

import torch
import torch.nn.functional as F
from torch import nn

from tacit.config import ModelConfig, normalize_rope
from tacit.distributed.communicator import Communicator
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.layers.attention import Attention
from tacit.layers.data_parallel import over_every_rank
from tacit.layers.norm import GemmaRMSNorm
from tacit.layers.rotary import RotaryEmbedding
from tacit.models.base import CausalLM, DecoderState
from tacit.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaModel

SLIDING, FULL = "sliding_attention", "full_attention"
# A layer's index into the stacked cos/sin of a step (Gemma3Model.begin_forward).
ROPE_INDEX = {SLIDING: 0, FULL: 1}
# transformers' Gemma3TextConfig defaults where a config leaves the keys out (the 27B's does).
DEFAULT_ROPE_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}
DEFAULT_SLIDING_WINDOW_PATTERN = 6
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def gemma3_layer_types(hf: dict[str, Any]) -> list[str]:
    """Each layer's kind: the config's `layer_types`, else every `sliding_window_pattern`-th
    layer global (transformers' rule for configs written before layer_types existed)."""
    n = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None:
        pattern = int(
            hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or DEFAULT_SLIDING_WINDOW_PATTERN
        )
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    if len(types) != n or any(t not in ROPE_INDEX for t in types):
        raise ValueError(
            f"layer_types={types!r}: must list num_hidden_layers={n} entries, each {SLIDING!r} or {FULL!r}"
        )
    return list(types)


def gemma3_rope_parameters(hf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{layer kind: rope dict as normalize_rope gives it}. transformers 5 writes
    rope_parameters = {"sliding_attention": {...}, "full_attention": {...}}; older configs give
    rope_theta + rope_scaling (the global layers') and rope_local_base_freq (the sliding ones')."""
    params = hf.get("rope_parameters") or {}
    if SLIDING in params or FULL in params:
        per_kind = {kind: dict(params.get(kind) or {}) for kind in (SLIDING, FULL)}
    else:
        full = {**params, **(hf.get("rope_scaling") or {})}
        if hf.get("rope_theta") is not None:
            full.setdefault("rope_theta", hf["rope_theta"])
        sliding = {} if hf.get("rope_local_base_freq") is None else {"rope_theta": hf["rope_local_base_freq"]}
        per_kind = {SLIDING: sliding, FULL: full}
    for kind, rope in per_kind.items():
        rope.setdefault("rope_theta", DEFAULT_ROPE_THETA[kind])
    return {kind: normalize_rope({"rope_parameters": rope}) for kind, rope in per_kind.items()}


def check_gemma3_config(path: str, hf: dict[str, Any]) -> None:
    """What this implementation does not run, refused by name before anything is built."""
    if hf.get("attn_logit_softcapping") is not None:
        # transformers 5.25's Gemma 3 ignores it too; Gemma 2 used it, Gemma 3's checkpoints set null.
        raise ValueError(f"{path}: attn_logit_softcapping={hf['attn_logit_softcapping']!r} is not supported; use null")
    if hf.get("use_bidirectional_attention"):
        raise ValueError(f"{path}: use_bidirectional_attention=true (an embedding model) is not supported")
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise ValueError(f"{path}: hidden_activation={act!r} is not supported; valid: {', '.join(ACTIVATIONS)}")
    if SLIDING in gemma3_layer_types(hf) and not hf.get("sliding_window"):
        raise ValueError(
            f"{path}: sliding layers need sliding_window (an integer >= 1); got {hf.get('sliding_window')!r}"
        )


class GemmaMLP(LlamaMLP):
    """LlamaMLP's gate/up/down with GELU in place of SiLU. A subclass, not an activation argument
    to LlamaMLP: code that takes LlamaMLP by exact type as SwiGLU never takes this one."""

    def __init__(self, hidden: int, intermediate: int, act: str, tp: TensorParallel = SINGLE) -> None:
        super().__init__(hidden, intermediate, tp=tp)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.act(gate) * up, reduce=reduce)


class Gemma3Attention(LlamaAttention):
    """Qwen3's attention (q/k norm, one rotation) with Gemma's norms, its query_pre_attn_scalar
    scale, a sliding window on sliding layers, and its layer kind's rope (from stacked tables)."""

    def __init__(self, cfg: ModelConfig, kind: str, tp: TensorParallel = SINGLE) -> None:
        bias = bool(cfg.get("attention_bias", False))
        super().__init__(cfg, qkv_bias=bias, o_bias=bias, qk_norm=True, tp=tp)
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.q_norm = GemmaRMSNorm(self.head_dim, eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps)
        window = int(cfg.hf["sliding_window"]) if kind == SLIDING else None
        scale = float(cfg.get("query_pre_attn_scalar", self.head_dim)) ** -0.5
        self.attn = Attention(self.num_heads, self.head_dim, self.num_kv_heads, scale, sliding_window=window)
        self.rope_index = ROPE_INDEX[kind]

    def forward(
        self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor, reduce: bool = True
    ) -> torch.Tensor:
        i = self.rope_index
        return super().forward(x, rotary, cos[i], sin[i], reduce=reduce)


class Gemma3DecoderLayer(LlamaDecoderLayer):
    """Llama's layer with a norm after attention and after the MLP as well as before each; the
    post-norms apply to the whole (all-reduced) output, so under tensor parallelism they follow
    the reduction."""

    def __init__(self, cfg: ModelConfig, attn: nn.Module, mlp: nn.Module, tp: TensorParallel = SINGLE) -> None:
        super().__init__(cfg, attn, mlp, tp)
        hidden, eps = cfg.hf["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not self.data_parallel:
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rotary, cos, sin))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        if len(x):  # a rank with no requests this step attends over nothing but joins the MLP
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rotary, cos, sin))
        mlp_out = over_every_rank(lambda h: self.mlp(h, reduce=False), self.pre_feedforward_layernorm(x), self)
        return x + self.post_feedforward_layernorm(mlp_out)

    def stages(
        self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor
    ) -> Generator[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = yield self.self_attn(self.input_layernorm(x), rotary, cos, sin, reduce=False)
        x = x + self.post_attention_layernorm(attn)
        mlp = yield self.mlp(self.pre_feedforward_layernorm(x), reduce=False)
        return x + self.post_feedforward_layernorm(mlp)


class Gemma3Model(LlamaModel):
    """The stack with a scaled embedding, Gemma's final norm and one rope per layer kind: a
    step's cos/sin are both kinds' tables stacked ([2, T, D/2], ROPE_INDEX), each attention
    layer picking its own."""

    def __init__(self, cfg: ModelConfig, make_layer: Callable[[int], nn.Module], tp: TensorParallel = SINGLE) -> None:
        super().__init__(cfg, make_layer, rotary_dim=cfg.head_dim, tp=tp)
        hf = cfg.hf
        self.norm = GemmaRMSNorm(hf["hidden_size"], cfg.get("rms_norm_eps", 1e-6))
        self.embed_scale = float(hf["hidden_size"]) ** 0.5
        ropes = gemma3_rope_parameters(hf)
        max_pos = int(cfg.get("max_position_embeddings", 2048))
        with torch.device("cpu"):  # the model itself is built on the meta device
            # self.rotary (LlamaModel's, rotate() for every layer) becomes the global layers'.
            self.rotary = RotaryEmbedding(cfg.head_dim, max_pos, ropes[FULL])
            self.rotary_local = RotaryEmbedding(cfg.head_dim, max_pos, ropes[SLIDING])

    def begin_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> DecoderState:
        x = self.embed_tokens(input_ids)
        # float32 first, then the model's dtype: transformers' buffer, rounded the same two times.
        x = x * torch.tensor(self.embed_scale, dtype=torch.float32).to(x.dtype)
        local = self.rotary_local.cos_sin(positions, x.dtype)
        full = self.rotary.cos_sin(positions, x.dtype)
        # Stacked in ROPE_INDEX order: 0 sliding, 1 full.
        return DecoderState(x, torch.stack((local[0], full[0])), torch.stack((local[1], full[1])))


class Gemma3ForCausalLM(CausalLM):
    supports_tensor_parallel = True

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        check_gemma3_config(cfg.path, cfg.hf)
        if cfg.hf.get("tie_word_embeddings") is None:
            # Gemma3TextConfig's default: the 1B's config.json leaves the key out and ships no lm_head.
            cfg = dataclasses.replace(cfg, hf={**cfg.hf, "tie_word_embeddings": True})
        self.tp = tp
        self.comm: Communicator | None = None  # the tensor-parallel group's (layers/linear.use_communicator)
        hf = cfg.hf
        kinds = gemma3_layer_types(hf)
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"

        def make_layer(i: int) -> nn.Module:
            attn = Gemma3Attention(cfg, kinds[i], tp=tp.attention)
            mlp = GemmaMLP(hf["hidden_size"], hf["intermediate_size"], act, tp=tp)
            return Gemma3DecoderLayer(cfg, attn, mlp, tp)

        self.model = Gemma3Model(cfg, make_layer, tp=tp)
        self._init_head(cfg, tp)
        self.final_logit_softcapping = hf.get("final_logit_softcapping")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.final_logit_softcapping
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap
