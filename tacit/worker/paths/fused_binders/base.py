"""What every fused-decoder binder shares: the registry that picks one by architecture, the
checks both layer families make, and the dense MLP's weights.

A binder reads a built, loaded model (plain torch modules, Hugging Face names) and hands its
weights and KV caches to the C++ FusedDecoder (kernels/cpu_fused_decode.py), or says why it
cannot; the model itself knows nothing of the fused step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from tacit.kernels.cpu_fused_decode import ShardedDecoder
from tacit.layers.ggml_linear_method import ggml_or_bf16, weight_parts
from tacit.models.llama import LlamaMLP
from tacit.registry import Registry


class FusedDecoderBinder(ABC):
    """Binds one family of architectures (registered by their config.json names) to the C++ step."""

    name: str

    @abstractmethod
    def unsupported_reason(self, model: nn.Module) -> str | None:
        """Why the fused step cannot run this model's decode step, or None if it can."""

    @abstractmethod
    def bind(self, model: nn.Module, kernels: ModuleType, block_size: int, max_positions: int) -> Any:
        """The C++ decoder over the model's weights and KV caches (shared, not copied). Raises
        ValueError/RuntimeError for a shape the kernel does not take."""

    def mlp_unsupported_reason(self, mlp: nn.Module) -> str | None:
        """Why the fused step cannot run this layer's MLP (the families with MoE MLPs extend it)."""
        if type(mlp) is not LlamaMLP:
            return "not a dense Llama MLP"
        if mlp.gate_up_proj.bias is not None or mlp.down_proj.bias is not None:
            return "MLP biases"
        return None

    def mlp_weights(self, mlp: nn.Module) -> dict[str, Any]:
        """The layer-weights fields of this layer's MLP (a dense one here)."""
        gate_up, gate_up_types = weight_parts(mlp.gate_up_proj)
        return dict(
            gate_up=gate_up,
            down=mlp.down_proj.weight.data,
            gate_up_types=gate_up_types,
            down_type=ggml_or_bf16(mlp.down_proj),
        )


FUSED_DECODER_BINDERS = Registry("fused decoder binder")


def register_fused_binder(*architectures: str):
    """Register a binder class under each architecture name (config.json "architectures") it serves."""

    def add(cls: type[FusedDecoderBinder]) -> type[FusedDecoderBinder]:
        for arch in architectures:
            FUSED_DECODER_BINDERS.register(arch)(cls)
        cls.name = architectures[0]
        return cls

    return add


def tensor_parallel_reason(model: nn.Module) -> str | None:
    """Under tensor parallelism the fused step all-reduces in C++: it needs the communicator's
    C all-reduce (the models that run tensor-parallel keep their group's in model.comm)."""
    tp, comm = model.tp, getattr(model, "comm", None)
    if tp.size > 1 and (comm is None or comm.c_all_reduce_f32() is None):
        return f"tensor parallel over a communicator with no C all-reduce ({getattr(comm, 'name', None)})"
    return None


def one_eps(norms: Iterable[nn.Module]) -> float:
    """The RMSNorm eps every norm shares; the C++ decoder takes one."""
    eps = {n.eps for n in norms}
    if len(eps) != 1:
        raise ValueError(f"RMSNorm eps differs between layers ({sorted(eps)}); the fused decoder takes one")
    return eps.pop()


def dense_intermediate(layers: list[nn.Module]) -> int:
    """The intermediate width of the dense MLPs (0 where every layer's MLP is an MoE)."""
    return next((layer.mlp.intermediate for layer in layers if isinstance(layer.mlp, LlamaMLP)), 0)


def rope_tables(model: nn.Module, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One cos/sin table for every position, built by the same torch ops the model uses, so the
    fused path rotates by exactly the values the torch path computes per step."""
    return model.model.rotary.cos_sin(torch.arange(max_positions), torch.bfloat16)


def for_this_rank(model: nn.Module, decoder: Any) -> Any:
    """The decoder as this rank runs it: itself, or a tensor-parallel rank's ShardedDecoder
    that all-reduces in C++ and looks tokens up in its slice of the vocabulary."""
    if model.tp.size == 1:
        return decoder
    decoder.set_all_reduce(*model.comm.c_all_reduce_f32())
    return ShardedDecoder(decoder, model.model.embed_tokens, model.tp.data_parallel)


def decoder_parameters(model: nn.Module) -> Iterator[torch.Tensor]:
    """The parameters the fused step reads: all but a proposer's layers built into the model
    (model.draft_layers: MTP's, which run on the torch path between steps)."""
    return (p for name, p in model.named_parameters() if not name.startswith("draft_layers."))


def weights_not_bf16(params: Iterable[torch.Tensor]) -> bool:
    # GGML blocks (uint8: linear layers, embedding tables, MoE expert stacks) run as they are.
    return any(p.dtype not in (torch.bfloat16, torch.uint8) for p in params)


def static_slots(slots: torch.Tensor | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The fused step's slot callback for an expert-parallel rank: the same table every step."""
    return None if slots is None else (lambda ids, x: slots)
