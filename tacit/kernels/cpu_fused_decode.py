"""A Llama-family decode step as one C++ call on CPU (csrc/llama_decode.cpp).

The torch path runs a batch-1 decode step of SmolLM2-135M as ~1,500 small ops; their
dispatch (~15 ms) cost more than streaming the weights (~9 ms). The fused decoder keeps the
weights and KV caches the torch model already owns (no copy), takes the step's token ids,
positions and block tables, and returns the final-normed hidden states; the model runner
projects and samples them as usual. It runs every step in which each request brings one
token (decode-only steps, however many rows), and the one-token rows of mixed steps, whose
prefill chunks take the torch path (the work there is in large GEMMs and the dispatch
overhead is small beside it; see ModelRunner._splits_mixed_step).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import torch
from torch import nn

from tacit.kernels.torch_attention import TorchAttentionBackend


def _unsupported_reason(model: nn.Module) -> str | None:
    from tacit.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP

    if not isinstance(model, LlamaForCausalLM):
        return f"{type(model).__name__} is not a Llama-family model"
    if model.model.rotary.interleaved:
        return "interleaved rotary"
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if not isinstance(attn, LlamaAttention) or type(mlp) is not LlamaMLP:
            return f"layer {i} is not a dense Llama layer"
        if mlp.gate_up_proj.bias is not None or mlp.down_proj.bias is not None:
            return f"layer {i} has MLP biases"
        if type(attn.attn.backend) is not TorchAttentionBackend:
            return f"layer {i} uses another attention backend"
        cache = attn.attn.kv_cache
        if cache is None or cache.dtype != torch.bfloat16 or cache.device.type != "cpu":
            return f"layer {i} has no bf16 CPU KV cache"
    if any(p.dtype != torch.bfloat16 for p in model.parameters()):
        return "weights are not bf16"
    return None


def _eps(norms: list[nn.Module]) -> float:
    values = {n.eps for n in norms}
    if len(values) != 1:
        raise ValueError(f"RMSNorm eps differs between layers ({sorted(values)}); the fused decoder takes one")
    return values.pop()


def build_fused_decoder(model: nn.Module, kernels: ModuleType, block_size: int, max_positions: int) -> Any | None:
    """The C++ LlamaDecoder bound to `model`'s weights and KV caches, or None if it cannot run it."""
    if kernels is None or _unsupported_reason(model) is not None:
        return None
    try:
        return _bind(model, kernels, block_size, max_positions)
    except (ValueError, RuntimeError) as e:  # a shape the kernel does not take: the torch path still runs it
        print(f"tacit: fused decode step unavailable for this model ({e}); using the torch path", file=sys.stderr)
        return None


def _bind(model: nn.Module, kernels: ModuleType, block_size: int, max_positions: int) -> Any:
    lm = model.model
    layers = list(lm.layers)
    first = layers[0].self_attn
    norms = [lm.norm] + [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    if first.qk_norm:
        norms += [n for layer in layers for n in (layer.self_attn.q_norm, layer.self_attn.k_norm)]
    # One table for every position, built by the same torch ops the model uses, so the fused
    # path rotates by exactly the cos/sin values the torch path would compute per step.
    cos, sin = lm.rotary.cos_sin(torch.arange(max_positions), torch.bfloat16)
    decoder = kernels.LlamaDecoder(lm.embed_tokens.weight.data, lm.norm.weight.data, cos.contiguous(),
                                   sin.contiguous(), first.num_heads, first.num_kv_heads, first.head_dim,
                                   layers[0].mlp.intermediate, _eps(norms), first.attn.scale, block_size)
    for layer in layers:
        a = layer.self_attn
        bias = a.qkv_proj.bias
        decoder.add_layer(layer.input_layernorm.weight.data, a.qkv_proj.weight.data,
                          None if bias is None else bias.data,
                          a.q_norm.weight.data if a.qk_norm else None, a.k_norm.weight.data if a.qk_norm else None,
                          a.o_proj.weight.data, None if a.o_proj.bias is None else a.o_proj.bias.data,
                          layer.post_attention_layernorm.weight.data, layer.mlp.gate_up_proj.weight.data,
                          layer.mlp.down_proj.weight.data, a.attn.kv_cache)
    return decoder
