"""Instantiate a model without initializing it, then fill it from a checkpoint."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.model_config_checks import check_required_sizes
from tacit.models.registry import get_model_class


def build_model(
    cfg: ModelConfig,
    weights: Callable[[], Iterator[tuple[str, torch.Tensor]]],
    device: torch.device,
    free_memory: int | None = None,
) -> nn.Module:
    """weights: opens the checkpoint's tensors (ModelSource.weights); called once the architecture
    is known to be supported and before any allocation, since opening checks the files (a
    truncated safetensors shard fails there, not after the model took its memory).
    free_memory: bytes the device has; a model whose weights exceed it is refused before any
    allocation (hidden_size 1e9 once tried to allocate 196 TB)."""
    cls = get_model_class(cfg.architecture)
    check_required_sizes(cfg.path, cfg.hf)
    tensors = weights()
    # Meta device: no memory and no random init for weights we are about to overwrite.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(cfg.dtype)
    try:
        with torch.device("meta"):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    if free_memory is not None and need > free_memory:
        raise ValueError(
            f"{cfg.path}: the model's weights need {need / 2**30:.1f} GiB in {cfg.dtype}, more than the "
            f"{free_memory / 2**30:.1f} GiB free on {device}; check the config's sizes or use a smaller model"
        )
    model = model.to_empty(device=device)
    for module in model.modules():
        if getattr(module, "keep_fp32", False):
            module.float()
    if getattr(model, "tie_word_embeddings", False):
        # to_empty materializes shared parameters separately; tie them again.
        model.lm_head.weight = model.model.embed_tokens.weight
    model.load_weights(tensors)
    return model.eval()
