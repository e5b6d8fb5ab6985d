"""Quantization configs: how each linear layer of one model holds and multiplies its weight.

vLLM's `get_quantization_config` + `QuantizationConfig.get_quant_method(layer, prefix)`: one
config per model, chosen from the registry below by what the engine asked for (ModelConfig.
quantization, quantization_overrides) and what the checkpoint holds (its GGML-typed tensors);
the config then says, layer by layer, which LinearMethod builds the layer's weight (None:
the one it was built with), and the same for MoE expert stacks and the embedding table.
apply_quantization asks it about every module of a model built on the meta device, before
any weight is allocated; loaded() wraps the checkpoint's tensors (quantize-at-load converts
them there, one at a time).
"""

from __future__ import annotations

from typing import ClassVar, Iterator

import torch
from torch import nn

from tacit.config import HF_QUANTIZATIONS, ModelConfig
from tacit.kernels.ggml_quant import GGMLTensor
from tacit.layers.embedding import GGMLEmbedding
from tacit.layers.linear import LinearBase, ggml_linear_method
from tacit.layers.linear_method import LinearMethod
from tacit.layers.moe import FusedMoE, use_ggml_expert_stacks, use_ggml_experts
from tacit.models.quantize_at_load import quantization_plan, quantized_as_loaded
from tacit.registry import Registry

Tensors = Iterator[tuple[str, torch.Tensor | GGMLTensor]]
_EMBEDDING = "model.embed_tokens"


class QuantizationConfig:
    """The unquantized default: every layer keeps the method it was built with."""

    name: ClassVar[str]
    # Among the configs that apply to a model, the lowest priority is chosen.
    priority: ClassVar[int] = 100

    def __init__(self, cfg: ModelConfig, device: torch.device, quantized_weights: dict[str, int]) -> None:
        """quantized_weights: {HF name: GGML type} of the checkpoint tensors that come as GGML blocks."""
        self.cfg, self.device, self.quantized_weights = cfg, device, quantized_weights

    @classmethod
    def applies(cls, cfg: ModelConfig, device: torch.device, quantized_weights: dict[str, int]) -> bool:
        return True

    def check(self) -> None:
        """Refuse, with a ValueError naming the setting, what this config cannot do with this checkpoint."""

    def prepare(self, model: nn.Module) -> None:
        """Whole-model planning before the layers are asked (the model is on the meta device)."""

    def get_quant_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        """The method that builds this linear layer's weight, or None to keep the one it has."""
        return None

    def quantize_experts(self, moe: FusedMoE, prefix: str) -> None:
        """Set how this MoE layer's expert stacks are held (nothing: in the model's dtype)."""

    def get_embedding(self, table: nn.Module, prefix: str) -> nn.Module | None:
        """A replacement for the token embedding table, or None to keep it."""
        return None

    def loaded(self, tensors: Tensors) -> Tensors:
        """The checkpoint's tensors as the model loads them."""
        return tensors

    def ggml_method(self, layer: LinearBase, prefix: str, types: dict[str, int]) -> LinearMethod | None:
        cfg = self.cfg
        return ggml_linear_method(
            prefix, layer, types, self.device.type, cfg.dtype, cfg.cpu_kernels, not cfg.ggml_bf16_activations
        )


QUANTIZATION_CONFIGS = Registry("quantization config")
register_quantization_config = QUANTIZATION_CONFIGS.register
register_quantization_config("unquantized")(QuantizationConfig)


def keeps_ggml_weights(cfg: ModelConfig, device: torch.device) -> bool:
    """Whether GGML-quantized checkpoint weights stay quantized (cfg.quantization): "gguf" always,
    "none" never, "auto" where tacit's CPU kernels multiply them (CPU, bfloat16, AVX512-BF16);
    elsewhere only the torch reference would, which dequantizes the whole matrix every call."""
    if cfg.quantization != "auto":
        return cfg.quantization == "gguf"
    if device.type != "cpu" or cfg.dtype != torch.bfloat16:
        return False
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    return load_cpu_kernels(cfg.cpu_kernels) is not None


@register_quantization_config("quantize_at_load")
class QuantizeAtLoadConfig(QuantizationConfig):
    """int8 / int4 (and quantization_overrides) over an unquantized Hugging Face checkpoint: the
    planned layers become GGML-method layers, and their tensors are converted one at a time as
    they stream in (models/quantize_at_load.py)."""

    priority = 10

    @classmethod
    def applies(cls, cfg: ModelConfig, device: torch.device, quantized_weights: dict[str, int]) -> bool:
        return cfg.quantization in HF_QUANTIZATIONS or bool(cfg.quantization_overrides)

    def check(self) -> None:
        cfg = self.cfg
        if cfg.quantization in HF_QUANTIZATIONS and self.quantized_weights:
            raise ValueError(
                f"quantization={cfg.quantization!r}: int8/int4 quantize an unquantized Hugging Face checkpoint "
                f"at load; {cfg.path}'s weights are already quantized: use auto|gguf|none"
            )
        if cfg.quantization_overrides and self.quantized_weights:
            raise ValueError(
                f"quantization_overrides apply to an unquantized Hugging Face checkpoint quantized at load; "
                f"{cfg.path}'s weights are already quantized, their types fixed by the file"
            )

    def prepare(self, model: nn.Module) -> None:
        self.plan = quantization_plan(model, self.cfg)
        self.tied_head = getattr(model, "tie_word_embeddings", False) and "lm_head.weight" in self.plan

    def get_quant_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        return self.ggml_method(layer, prefix, self.plan)

    def quantize_experts(self, moe: FusedMoE, prefix: str) -> None:
        use_ggml_experts(prefix, moe, self.plan)

    def loaded(self, tensors: Tensors) -> Tensors:
        return quantized_as_loaded(tensors, self.plan, self.cfg.quantization_group_size, self.tied_head)


@register_quantization_config("ggml_checkpoint")
class GGMLCheckpointConfig(QuantizationConfig):
    """A checkpoint whose weights come as GGML blocks (GGUF; GPTQ, AWQ, FP8 turned into blocks by
    the loader), kept as they are where keeps_ggml_weights says so."""

    priority = 20

    @classmethod
    def applies(cls, cfg: ModelConfig, device: torch.device, quantized_weights: dict[str, int]) -> bool:
        return bool(quantized_weights) and keeps_ggml_weights(cfg, device)

    def prepare(self, model: nn.Module) -> None:
        # Layers the model reads the weight of itself (a MoE router, MLA's kv_b_proj) stay
        # float: their GGML tensors dequantize as they load (layers/linear.weight_data).
        dense = tuple(getattr(model, "dense_weight_linears", ()))
        self.types = {n: t for n, t in self.quantized_weights.items() if not n.removesuffix(".weight").endswith(dense)}
        self.embed_type = self.types.get(f"{_EMBEDDING}.weight")
        if self.embed_type is not None and model.get_submodule(_EMBEDDING).sharded:
            self.embed_type = None  # a vocab-parallel rank's slice arrives dequantized
        if self.embed_type is not None and getattr(model, "tie_word_embeddings", False):
            # A tied lm_head shares the table's blocks: the default model's Q8_0 head streams
            # 30 MB a token instead of bf16's 57 MB, held once.
            self.types["lm_head.weight"] = self.embed_type

    def get_quant_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        return self.ggml_method(layer, prefix, self.types)

    def quantize_experts(self, moe: FusedMoE, prefix: str) -> None:
        use_ggml_expert_stacks(prefix, moe, self.types)

    def get_embedding(self, table: nn.Module, prefix: str) -> nn.Module | None:
        # The table stays in its blocks too, rows dequantized as looked up (layers/embedding.py).
        if prefix != _EMBEDDING or self.embed_type is None:
            return None
        cfg = self.cfg
        return GGMLEmbedding.for_type(
            self.embed_type, table.num_embeddings, table.embedding_dim, self.device.type, cfg.dtype, cfg.cpu_kernels
        )


def get_quantization_config(
    cfg: ModelConfig, device: torch.device, quantized_weights: dict[str, int] | None = None
) -> QuantizationConfig:
    """The config of the lowest priority among those that apply to this model and checkpoint."""
    quantized_weights = quantized_weights or {}
    fits = [cls for cls in QUANTIZATION_CONFIGS.values() if cls.applies(cfg, device, quantized_weights)]
    return min(fits, key=lambda cls: cls.priority)(cfg, device, quantized_weights)


def apply_quantization(model: nn.Module, config: QuantizationConfig) -> None:
    """Ask `config` about every module of a model built on the meta device, in one pass: the
    embedding table, each linear layer's method, each MoE layer's expert stacks."""
    config.prepare(model)
    for prefix, module in list(model.named_modules()):
        if isinstance(module, LinearBase):
            method = config.get_quant_method(module, prefix)
            if method is not None:
                module.rebuild_weights(method)
        elif isinstance(module, FusedMoE):
            config.quantize_experts(module, prefix)
        elif prefix == _EMBEDDING:
            table = config.get_embedding(module, prefix)
            if table is not None:
                parent, _, leaf = prefix.rpartition(".")
                setattr(model.get_submodule(parent), leaf, table)
