"""Instantiate a model without initializing it, then fill it from a checkpoint."""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.models.registry import get_model_class


def build_model(cfg: ModelConfig, weights: Iterator[tuple[str, torch.Tensor]], device: torch.device) -> nn.Module:
    cls = get_model_class(cfg.architecture)
    # Meta device: no memory and no random init for weights we are about to overwrite.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(cfg.dtype)
    try:
        with torch.device("meta"):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = model.to_empty(device=device)
    for module in model.modules():
        if getattr(module, "keep_fp32", False):
            module.float()
    if getattr(model, "tie_word_embeddings", False):
        # to_empty materializes shared parameters separately; tie them again.
        model.lm_head.weight = model.model.embed_tokens.weight
    model.load_weights(weights)
    return model.eval()
