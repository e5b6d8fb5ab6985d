"""The Llama family's GQA layers (Llama, SmolLM2, Qwen2/2.5, Qwen3, Qwen3-MoE) bound to the fused step."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch import nn

from tacit.kernels.cpu_fused_decode import DecoderLayerWeights, MoELayerWeights, bind_gqa_decoder
from tacit.kernels.ggml_quant import BF16
from tacit.kernels.torch_attention import TorchAttentionBackend
from tacit.layers.embedding import GGMLEmbedding
from tacit.layers.ggml_linear_method import ggml_or_bf16, weight_parts
from tacit.models.llama import LlamaAttention
from tacit.models.qwen3_moe import Qwen3MoeSparseBlock
from tacit.worker.paths.fused_binders.base import (
    FusedDecoderBinder,
    decoder_parameters,
    dense_intermediate,
    for_this_rank,
    one_eps,
    register_fused_binder,
    rope_tables,
    static_slots,
    tensor_parallel_reason,
    weights_not_bf16,
)

# csrc/decode_attention_int8.cpp's kMaxGroup: query heads per kv head it keeps in registers.
INT8_KV_MAX_GROUP = 16


@register_fused_binder("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
class LlamaFusedBinder(FusedDecoderBinder):
    def unsupported_reason(self, model: nn.Module) -> str | None:
        reason = tensor_parallel_reason(model)
        if reason is not None:
            return reason
        if model.model.rotary.interleaved:
            return "interleaved rotary"
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            if not isinstance(attn, LlamaAttention):
                return f"layer {i} is not a Llama attention layer"
            reason = self.mlp_unsupported_reason(layer.mlp)
            if reason is not None:
                return f"layer {i}: {reason}"
            # The fused step reads the cache in place and attends itself, as the torch paged backend does.
            if attn.attn.backend is None or attn.attn.backend.name != TorchAttentionBackend.name:
                return f"layer {i} uses another attention backend"
            if attn.attn.sliding_window is not None or attn.attn.sinks is not None:
                return f"layer {i} has a sliding window or attention sinks (the fused step attends to every token)"
            cache, spec = attn.attn.kv_cache, attn.attn.kv_cache_spec
            if cache is None or spec.dtype not in (torch.bfloat16, torch.int8) or cache.device.type != "cpu":
                return f"layer {i} has no bf16 or int8 CPU KV cache"
            if spec.quantized and attn.num_heads // attn.num_kv_heads > INT8_KV_MAX_GROUP:
                return f"more than {INT8_KV_MAX_GROUP} query heads per kv head over an int8 KV cache"
        if weights_not_bf16(decoder_parameters(model)):
            return "weights are not bf16"
        return None

    def mlp_unsupported_reason(self, mlp: nn.Module) -> str | None:
        if isinstance(mlp, Qwen3MoeSparseBlock):
            return None
        return super().mlp_unsupported_reason(mlp)

    def mlp_weights(self, mlp: nn.Module) -> dict[str, Any]:
        if not isinstance(mlp, Qwen3MoeSparseBlock):
            return super().mlp_weights(mlp)
        experts, routing = mlp.experts, mlp.experts.routing
        stacks = experts.expert_weights() if not experts.streamed else experts.streamed_weights()
        moe = MoELayerWeights(
            router=mlp.gate.weight.data,
            w13=stacks.w13,
            w2=stacks.w2,
            w13_type=BF16 if stacks.w13_type is None else stacks.w13_type,
            w2_type=BF16 if stacks.w2_type is None else stacks.w2_type,
            top_k=routing.top_k,
            renormalize=routing.renormalize,
            expert_slots=experts.acquire_streamed if experts.streamed else static_slots(experts.expert_slots()),
        )
        return dict(gate_up=None, down=None, moe=moe)

    def bind(self, model: nn.Module, kernels: ModuleType, block_size: int, max_positions: int) -> Any:
        lm = model.model
        layers = list(lm.layers)
        first = layers[0].self_attn
        norms = [lm.norm] + [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        if first.qk_norm:
            norms += [n for layer in layers for n in (layer.self_attn.q_norm, layer.self_attn.k_norm)]
        eps = one_eps(norms)
        cos, sin = rope_tables(model, max_positions)

        def data(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.data

        weights = [
            DecoderLayerWeights(
                input_norm=layer.input_layernorm.weight.data,
                qkv=qkv,
                qkv_bias=data(a.qkv_proj.bias),
                q_norm=a.q_norm.weight.data if a.qk_norm else None,
                k_norm=a.k_norm.weight.data if a.qk_norm else None,
                o_proj=a.o_proj.weight.data,
                o_bias=data(a.o_proj.bias),
                post_attention_norm=layer.post_attention_layernorm.weight.data,
                kv_cache=a.attn.kv_cache,
                qkv_types=qkv_types,
                o_type=ggml_or_bf16(a.o_proj),
                **self.mlp_weights(layer.mlp),
            )
            for layer in layers
            for a in [layer.self_attn]
            for qkv, qkv_types in [weight_parts(a.qkv_proj)]
        ]
        table = lm.embed_tokens
        decoder = bind_gqa_decoder(
            kernels,
            table.weight.data,
            table.ggml_type if isinstance(table, GGMLEmbedding) else BF16,
            lm.norm.weight.shape[0],
            lm.norm.weight.data,
            cos,
            sin,
            first.num_heads,
            first.num_kv_heads,
            first.head_dim,
            dense_intermediate(layers),
            eps,
            first.attn.scale,
            block_size,
            weights,
        )
        return for_this_rank(model, decoder)
