"""Instantiate a model without initializing it, then fill it from a checkpoint."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.kernels.ggml_quant import GGMLTensor
from tacit.layers.embedding import GGMLEmbedding
from tacit.layers.ggml_linear_method import GGMLLinearMethod
from tacit.layers.linear import checkpoint_shards
from tacit.layers.moe import FusedMoE, is_expert_weight
from tacit.model_config_checks import check_required_sizes
from tacit.models.quantization import apply_quantization, get_quantization_config
from tacit.models.registry import get_model_class


def _same_storage_kind(model: nn.Module) -> bool:
    """Whether a tied head can share the embedding's tensor: both plain, or both the same GGML
    type's blocks (a head quantized at load from a plain table has blocks of its own)."""
    head, table = model.lm_head, model.model.embed_tokens
    if table.weight.dtype != head.weight.dtype or table.weight.shape != head.weight.shape:
        return False
    if isinstance(table, GGMLEmbedding):
        return isinstance(head.linear_method, GGMLLinearMethod) and head.linear_method.ggml_type == table.ggml_type
    return True


def build_model(
    cfg: ModelConfig,
    weights: Callable[[], Iterator[tuple[str, torch.Tensor | GGMLTensor]]],
    device: torch.device,
    free_memory: int | None = None,
    quantized_weights: dict[str, int] | None = None,
    tp: TensorParallel = SINGLE,
    model_class: type[nn.Module] | None = None,
) -> nn.Module:
    """weights: opens the checkpoint's tensors (ModelSource.weights); called once the architecture
    is known to be supported and before any allocation, since opening checks the files (a
    truncated safetensors shard fails there, not after the model took its memory).
    free_memory: bytes the device has; a model whose weights exceed it is refused before any
    allocation (hidden_size 1e9 once tried to allocate 196 TB). quantized_weights: {HF name: GGML
    type} of the weights `weights` yields as GGML blocks; their linear layers keep them so when
    quantization.keeps_ggml_weights says. cfg.quantization int8/int4 quantizes a Hugging Face
    checkpoint's linear weights as they load instead (models/quantization.py picks the config).
    tp: the tensor-parallel shard this process builds and loads (each rank reads only its slice
    of each tensor). model_class: the module to build instead of the architecture's (DeepSeek's
    MTP layers, models/deepseek_mtp.py, from the same checkpoint)."""
    cls = model_class or get_model_class(cfg.architecture)
    if tp.size > 1 and not getattr(cls, "supports_tensor_parallel", False):
        raise ValueError(
            f"tensor_parallel_size={tp.size}: {cfg.architecture} does not run tensor-parallel yet; "
            "the Llama family (Llama, SmolLM2, Qwen2/2.5, Qwen3 dense) and Qwen3-MoE do"
        )
    check_required_sizes(cfg.path, cfg.hf)
    if tp.size > 1 and cfg.expert_cache_memory is not None:
        raise ValueError(
            f"expert_cache_memory with tensor_parallel_size={tp.size}: streamed experts run in one process only"
        )
    if cfg.expert_cache_memory is not None and quantized_weights:
        raise ValueError(
            f"expert_cache_memory: {cfg.path}'s weights are quantized (GPTQ / AWQ / FP8 / GGUF); "
            "only an unquantized safetensors MoE checkpoint's experts stream"
        )
    opened = dict(skip=is_expert_weight) if cfg.expert_cache_memory is not None else {}
    if tp.size == 1:
        tensors = weights(**opened)
    # Meta device: no memory and no random init for weights we are about to overwrite.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(cfg.dtype)
    try:
        with torch.device("meta"):
            model = cls(cfg, tp) if tp.size > 1 else cls(cfg)
        if tp.size > 1:
            # Opened once the layers say which slice of each tensor this rank reads (still
            # before any allocation: the model is on the meta device).
            tensors = weights(**opened, shards=checkpoint_shards(model))
        quantization = get_quantization_config(cfg, device, quantized_weights)
        quantization.check()
        if cfg.expert_cache_memory is not None:
            # The experts stay in the checkpoint (models/expert_streaming.py binds their cache).
            if not any(isinstance(m, FusedMoE) for m in model.modules()):
                raise ValueError(
                    f"expert_cache_memory: {cfg.path} is not an unquantized MoE checkpoint; only MoE experts stream"
                )
            for m in model.modules():
                if isinstance(m, FusedMoE):
                    m.stream_from_checkpoint()
        # How each linear layer, expert stack and the embedding table hold their weights
        # (models/quantization.py), chosen before anything is allocated.
        apply_quantization(model, quantization)
        tensors = quantization.loaded(tensors)
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
    if getattr(model, "tie_word_embeddings", False) and _same_storage_kind(model):
        # to_empty materializes shared parameters separately; tie them again.
        model.lm_head.weight = model.model.embed_tokens.weight
    model.load_weights(tensors)
    return model.eval()
