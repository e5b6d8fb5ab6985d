"""Bind a MoE model's experts to an ExpertCache that reads them from the checkpoint.

Each FusedMoE layer (built with stream_from_checkpoint, so it holds no experts) gets the cache
and its index among the MoE layers; every layer but the last also predicts the next layer's
experts: the next layer's router applied to this layer's input (the hidden states of adjacent
layers are close, which is what makes the guess good), its top-k prefetched on the cache's
background thread while this layer computes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tacit.layers.moe import ExpertStream, FusedMoE
from tacit.loader.hf import safetensors_files
from tacit.memory.expert_cache import PROJS, ExpertCache, safetensors_locations


def _block_of(model: nn.Module, experts_name: str) -> nn.Module:
    """The sparse block around a FusedMoE (it owns the router): `...mlp.experts` -> `...mlp`."""
    return model.get_submodule(experts_name.rsplit(".", 1)[0])


def min_expert_cache_bytes(model: nn.Module, max_num_batched_tokens: int, dtype: torch.dtype) -> int:
    """The smallest cache a step can run with: one layer's experts for the largest step, which
    may use min(E, top_k x tokens) of them at once."""
    need = 0
    for m in model.modules():
        if isinstance(m, FusedMoE):
            count = min(m.num_experts, m.routing.top_k * max_num_batched_tokens)
            need = max(need, count * ExpertCache.expert_bytes(m.hidden_size, m.intermediate_size, dtype))
    return need


def stream_experts(
    model: nn.Module, checkpoint: Path, cache_bytes: int, max_num_batched_tokens: int, dtype: torch.dtype
) -> ExpertCache:
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, FusedMoE) and m.streamed]
    if not layers:
        raise ValueError("expert_cache_memory: the model has no streamed MoE layers")
    shapes = {(m.hidden_size, m.intermediate_size) for _, m in layers}
    if len(shapes) != 1:
        raise ValueError(
            f"expert_cache_memory: MoE layers of different expert shapes {sorted(shapes)}; one cache needs one"
        )
    hidden, inter = shapes.pop()
    per_expert = ExpertCache.expert_bytes(hidden, inter, dtype)
    need = min_expert_cache_bytes(model, max_num_batched_tokens, dtype)
    if cache_bytes < need:
        raise ValueError(
            f"expert_cache_memory={cache_bytes} holds {cache_bytes // per_expert} experts of {per_expert} bytes; "
            f"a step of up to {max_num_batched_tokens} tokens (max_num_batched_tokens) may use {need // per_expert} "
            f"of one layer's experts at once: set expert_cache_memory to at least {need} bytes, or lower "
            f"max_num_batched_tokens"
        )
    where = safetensors_locations(safetensors_files(checkpoint))
    locations = {}
    for index, (name, m) in enumerate(layers):
        for e in range(m.num_experts):
            names = [f"{name}.{e}.{p}.weight" for p in PROJS]
            missing = [n for n in names if n not in where]
            if missing:
                raise ValueError(f"{checkpoint}: expert weight {missing[0]} is not in the checkpoint's shards")
            locs = tuple(where[n] for n in names)
            want = [(inter, hidden), (inter, hidden), (hidden, inter)]
            if [loc.shape for loc in locs] != want:
                got = [loc.shape for loc in locs]
                raise ValueError(f"{checkpoint}: expert {name}.{e} has shapes {got}; expected {want}")
            locations[(index, e)] = locs
    cache = ExpertCache(locations, cache_bytes // per_expert, hidden, inter, dtype)
    for index, (name, m) in enumerate(layers):
        prefetch = None
        if index + 1 < len(layers):
            nxt_name, nxt = layers[index + 1]
            prefetch = _predictor(cache, index + 1, _block_of(model, nxt_name), nxt)
        m.stream = ExpertStream(cache, index, prefetch)
    return cache


def _predictor(cache: ExpertCache, layer: int, block: nn.Module, experts: FusedMoE):
    def prefetch_next(x: torch.Tensor) -> None:
        _, ids = experts.kernel.route(block.router_logits(x).float(), experts.routing, block.correction_bias)
        cache.prefetch(layer, torch.unique(ids).tolist())

    return prefetch_next
