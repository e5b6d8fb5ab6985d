"""Reference MoE: sort token-slots by expert, one dense GEMM pair per expert that got tokens.

Sorting turns T*K scattered rows into E contiguous segments, so the loop runs over experts
(tens to hundreds), never over tokens or requests. GGML-quantized experts are dequantized one
active expert at a time (to the activations' dtype), never the whole stack.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tacit.kernels.ggml_quant import dequantize
from tacit.kernels.moe_kernel import ExpertActivation, ExpertWeights, MoEKernel, register_moe_kernel


def expert_matrix(stack: torch.Tensor, ggml_type: int | None, row: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """The [rows, cols] matrix at `row` of a stack, in `dtype`."""
    if ggml_type is None:
        return stack[row]
    return dequantize(stack[row], ggml_type, cols).to(dtype)


def gate_activation(gate: torch.Tensor, up: torch.Tensor, activation: ExpertActivation) -> torch.Tensor:
    """The gate and up halves joined as `activation` says (ExpertActivation)."""
    if activation.name == "silu":
        return F.silu(gate) * up
    # gpt-oss: the gate is clamped from above only, up on both sides (transformers' _apply_gate).
    gate = gate.clamp(max=activation.limit)
    up = up.clamp(min=-activation.limit, max=activation.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * activation.alpha))


def _bias(stack: torch.Tensor | None, row: int, dtype: torch.dtype) -> torch.Tensor | None:
    return None if stack is None else stack[row].to(dtype)


def swiglu_expert(x: torch.Tensor, experts: ExpertWeights, expert: int) -> torch.Tensor:
    hidden, inter, row = x.shape[-1], experts.intermediate_size, experts.row(expert)
    w13 = expert_matrix(experts.w13, experts.w13_type, row, hidden, x.dtype)
    gate, up = F.linear(x, w13, _bias(experts.w13_bias, row, x.dtype)).chunk(2, dim=-1)
    w2 = expert_matrix(experts.w2, experts.w2_type, row, inter, x.dtype)
    return F.linear(gate_activation(gate, up, experts.activation), w2, _bias(experts.w2_bias, row, x.dtype))


@register_moe_kernel("torch")
class TorchMoEKernel(MoEKernel):
    priority = 100  # the reference

    @classmethod
    def supports(cls, platform: str, dtype: torch.dtype) -> bool:
        return True

    @classmethod
    def supports_experts(cls, experts: ExpertWeights) -> bool:
        return True  # every activation and bias: the reference the others decline to

    def experts(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        routed: ExpertWeights,
        shared: ExpertWeights | None = None,
    ) -> torch.Tensor:
        num_tokens, top_k = topk_ids.shape
        flat_ids = topk_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        token_index = order // top_k
        counts = torch.bincount(flat_ids, minlength=routed.num_experts).tolist()
        xs = x[token_index]
        hidden = x.shape[-1]
        out = torch.empty(xs.shape[0], hidden, dtype=x.dtype, device=x.device)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            if routed.row(expert) < 0:  # held by another expert-parallel rank: adds nothing here
                out[start : start + count] = 0
            else:
                out[start : start + count] = swiglu_expert(xs[start : start + count], routed, expert)
            start += count
        weights = topk_weights.reshape(-1)[order].to(out.dtype)
        result = torch.zeros(num_tokens, hidden, dtype=x.dtype, device=x.device)
        result = result.index_add_(0, token_index, out * weights[:, None])
        return result if shared is None else result + swiglu_expert(x, shared, 0)
