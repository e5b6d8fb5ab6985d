"""DeepSeek-V3/R1 and Kimi-K2 (MLA attention, grouped-sigmoid MoE) bound to the fused step."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch import nn

from tacit.kernels.absorbed_mla_attention import AbsorbedMLAAttentionBackend, absorbed_weights, head_bmm_fits
from tacit.kernels.cpu_fused_decode import GroupedMoEWeights, MLALayerWeights, bind_mla_decoder
from tacit.kernels.ggml_quant import BF16
from tacit.kernels.torch_mla_attention import MLADims
from tacit.kernels.torch_moe import TorchMoEKernel
from tacit.layers.embedding import GGMLEmbedding
from tacit.layers.ggml_linear_method import MixedGGMLLinearMethod, ggml_or_bf16
from tacit.models.deepseek_v3 import DeepseekV3MoE
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


@register_fused_binder("DeepseekV3ForCausalLM")
class DeepseekV3FusedBinder(FusedDecoderBinder):
    def unsupported_reason(self, model: nn.Module) -> str | None:
        reason = tensor_parallel_reason(model)
        if reason is not None:
            return reason
        if not model.model.rotary.interleaved:
            return "half-split rotary (the fused MLA step rotates DeepSeek's interleaved pairs)"
        for i, layer in enumerate(model.model.layers):
            a = layer.self_attn
            if a.backend is None or a.backend.name != AbsorbedMLAAttentionBackend.name:
                return f"layer {i} uses another attention backend"
            cache = a.kv_cache
            if cache is None or a.kv_cache_spec.dtype not in (torch.bfloat16, torch.int8) or cache.device.type != "cpu":
                return f"layer {i} has no bf16 or int8 CPU latent cache"
            linears = [a.kv_a_proj_with_mqa, a.o_proj] + ([a.q_a_proj, a.q_b_proj] if a.q_lora_rank else [a.q_proj])
            if any(lin.bias is not None for lin in linears):
                return f"layer {i}: attention biases"
            if any(isinstance(lin.linear_method, MixedGGMLLinearMethod) for lin in linears):
                return f"layer {i}: a projection of mixed GGML types"
            if a.kv_b_proj.weight.dtype != torch.bfloat16:
                return f"layer {i}: kv_b_proj is not bf16 (the absorbed weights are split from it)"
            if a.rope_dim > 256:
                return f"layer {i}: a rotary width above 256"
            reason = self.mlp_unsupported_reason(layer.mlp)
            if reason is not None:
                return f"layer {i}: {reason}"
        routers = {
            id(p)
            for layer in model.model.layers
            if isinstance(layer.mlp, DeepseekV3MoE)
            for p in layer.mlp.gate.parameters()
        }
        # The routers are float32 by design (DeepseekV3Gate).
        if weights_not_bf16(p for p in decoder_parameters(model) if id(p) not in routers):
            return "weights are not bf16"
        return None

    def mlp_unsupported_reason(self, mlp: nn.Module) -> str | None:
        if not isinstance(mlp, DeepseekV3MoE):
            return super().mlp_unsupported_reason(mlp)
        if mlp.experts.streamed:
            return "streamed experts"
        if isinstance(mlp.experts.kernel, TorchMoEKernel):
            return "the torch MoE kernel"
        if mlp.shared_experts is not None and mlp.shared_expert_weights() is None:
            return "a shared expert the experts kernel does not fuse"
        return None

    def mlp_weights(self, mlp: nn.Module) -> dict[str, Any]:
        if not isinstance(mlp, DeepseekV3MoE):
            return super().mlp_weights(mlp)
        routing = mlp.experts.routing
        moe = GroupedMoEWeights(
            router=mlp.gate.weight.data.float().contiguous(),  # what router_logits multiplies by
            correction_bias=mlp.correction_bias.data.float().contiguous(),
            routed=mlp.experts.expert_weights(),
            shared=mlp.shared_expert_weights(),
            top_k=routing.top_k,
            renormalize=routing.renormalize,
            groups=routing.num_groups,
            topk_groups=routing.topk_groups,
            scaling=routing.scaling,
            expert_slots=static_slots(mlp.experts.expert_slots()),
        )
        return dict(moe=moe)

    def _layer(self, layer: nn.Module) -> MLALayerWeights:
        a = layer.self_attn
        dims = MLADims(heads=a.num_heads, rank=a.kv_lora_rank, rope=a.rope_dim, nope=a.nope_dim, v=a.v_dim)
        w_uk, w_uv_t = absorbed_weights(a.kv_b_proj.weight, dims)
        q_b = a.q_b_proj if a.q_lora_rank else a.q_proj
        return MLALayerWeights(
            input_norm=layer.input_layernorm.weight.data,
            q_a=a.q_a_proj.weight.data if a.q_lora_rank else None,
            q_a_type=ggml_or_bf16(a.q_a_proj) if a.q_lora_rank else BF16,
            q_a_norm=a.q_a_layernorm.weight.data if a.q_lora_rank else None,
            q_b=q_b.weight.data,
            q_b_type=ggml_or_bf16(q_b),
            kv_a=a.kv_a_proj_with_mqa.weight.data,
            kv_a_type=ggml_or_bf16(a.kv_a_proj_with_mqa),
            kv_a_norm=a.kv_a_layernorm.weight.data,
            w_uk=w_uk,
            w_uv_t=w_uv_t,
            o_proj=a.o_proj.weight.data,
            o_type=ggml_or_bf16(a.o_proj),
            post_attention_norm=layer.post_attention_layernorm.weight.data,
            latent_cache=a.kv_cache,
            head_bmm=head_bmm_fits(w_uk, w_uv_t),
            **self.mlp_weights(layer.mlp),
        )

    def bind(self, model: nn.Module, kernels: ModuleType, block_size: int, max_positions: int) -> Any:
        lm = model.model
        layers = list(lm.layers)
        norms = [lm.norm]
        for layer in layers:
            a = layer.self_attn
            norms += [layer.input_layernorm, layer.post_attention_layernorm, a.kv_a_layernorm]
            norms += [a.q_a_layernorm] if a.q_lora_rank else []
        eps = one_eps(norms)
        cos, sin = rope_tables(model, max_positions)
        table = lm.embed_tokens
        decoder = bind_mla_decoder(
            kernels,
            table.weight.data,
            table.ggml_type if isinstance(table, GGMLEmbedding) else BF16,
            lm.norm.weight.data,
            cos,
            sin,
            layers[0].self_attn.num_heads,
            dense_intermediate(layers),
            eps,
            layers[0].self_attn.scale,
            block_size,
            [self._layer(layer) for layer in layers],
        )
        return for_this_rank(model, decoder)
