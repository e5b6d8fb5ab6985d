"""The operator classes a step's time is split into, and which part of the model counts as which.

Every module of the torch path that does one class of work gets a category; nested modules
count their own time (exclusive time), so a decoder layer's own category holds only what its
children do not: the residual adds and the Python between them.
"""

from __future__ import annotations

import re

from torch import nn

from tacit.layers.kv_cache import KVCacheLayer
from tacit.layers.linear import LinearBase
from tacit.layers.moe import FusedMoE
from tacit.layers.norm import RMSNorm

# Report order. "host" is the step's wall time minus every other class: scheduling, input
# building, output processing, Python between modules, the embedding lookup.
CATEGORIES = ("gemm", "attention", "moe_routing", "experts", "norm", "communication", "sampling", "proposer", "host")
LABELS = {
    "gemm": "GEMM",
    "attention": "attention",
    "moe_routing": "MoE routing",
    "experts": "experts",
    "norm": "norms",
    "communication": "communication",
    "sampling": "sampling",
    "proposer": "draft proposer",
    "host": "Python/host",
}
# Where time outside the decoder layers goes: the final norm, lm_head and sampling.
HEAD = "head"
# verify: a decode step in which some request verifies draft tokens (speculative decoding).
STEP_KINDS = ("prefill", "decode", "verify", "mixed")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_of(name: str) -> str:
    """'model.layers.3.mlp.down_proj' or 'fused.layers.3.mlp' -> 'layers.3'; anything else -> HEAD."""
    m = _LAYER.search(name)
    return f"layers.{m.group(1)}" if m else HEAD


def layer_sort_key(layer: str) -> tuple[int, int]:
    """Decoder layers in order, then the head."""
    m = _LAYER.search(layer)
    return (0, int(m.group(1))) if m else (1, 0)


def module_category(name: str, module: nn.Module) -> str | None:
    """The class a module's own (exclusive) time counts as, or None to leave it unhooked."""
    if isinstance(module, LinearBase):
        # Qwen3-MoE's router is a Linear that the block multiplies by F.linear on its weight: never
        # called as a module, so its time lands in the block's own time (moe_routing, below).
        return "gemm"
    if isinstance(module, RMSNorm):
        return "norm"
    if isinstance(module, FusedMoE):
        return "experts"  # its own time beside route/experts: glue and the streamed-expert cache
    if isinstance(module, KVCacheLayer) or name.endswith(".self_attn"):
        return "attention"  # the projections inside are GEMMs; rotary, KV writes, SDPA are attention
    if name.endswith(".mlp"):
        # A sparse block's own time is its router product; a dense MLP's is silu(gate) * up, the
        # elementwise epilogue between its two GEMMs.
        return "moe_routing" if hasattr(module, "router_logits") else "gemm"
    if _LAYER.search(name) and re.search(r"layers\.\d+$", name):
        return "host"  # the decoder layer: residual adds and Python between its parts
    return None
