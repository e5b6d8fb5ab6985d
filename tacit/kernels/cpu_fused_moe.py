"""The CPU MoE kernel: routing and experts in two C++ calls (csrc/fused_moe.cpp).

At batch 1 the torch kernel's per-expert loop costs ~6 dispatched ops for each of 8 experts in
every layer; here a layer is one call to route (softmax or grouped-sigmoid top-k, selecting as
torch.topk does, ties included) and one to run the experts: a counting sort into per-expert
slot lists, gate/up with SiLU-times-up in the epilogue, down with the routing weight folded
into the sum, threads split across (expert, rows) work items. Expert weights are bf16 or GGML
blocks (Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K/MXFP4); a shared expert runs in the same call. gpt-oss's
routed experts (bf16 biases, the clamped SwiGLU) run in the same two phases: the biases join the
GEMV epilogues, the activation replaces SiLU-times-up.
"""

from __future__ import annotations

import torch

from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.ggml_quant import BF16
from tacit.kernels.moe_kernel import ExpertWeights, MoEKernel, register_moe_kernel
from tacit.kernels.moe_routing import MoERouting

# ExpertActivation.name -> csrc/fused_moe.h ExpertActivationKind.
_ACTIVATIONS = {"silu": 0, "swigluoai": 1}


@register_moe_kernel("cpu_fused")
class CPUFusedMoEKernel(MoEKernel):
    priority = 10
    uses_cpu_kernels = True

    def __init__(self) -> None:
        self._ops = load_cpu_kernels(True)
        if self._ops is None:
            raise RuntimeError("the cpu_fused MoE kernel needs tacit's AVX512-BF16 CPU kernels, which did not load")

    @classmethod
    def supports(cls, platform: str, dtype: torch.dtype) -> bool:
        return platform == "cpu" and dtype == torch.bfloat16 and load_cpu_kernels(True) is not None

    @classmethod
    def supports_experts(cls, experts: ExpertWeights) -> bool:
        # Every activation; biases in bf16, the activations' dtype the kernel adds them in.
        biases = [b for b in (experts.w13_bias, experts.w2_bias) if b is not None]
        return experts.activation.name in _ACTIVATIONS and all(b.dtype == torch.bfloat16 for b in biases)

    def route(
        self, router_logits: torch.Tensor, routing: MoERouting, correction_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sigmoid = routing.scoring == "sigmoid"
        if sigmoid and correction_bias is None:
            correction_bias = torch.zeros(router_logits.shape[-1])
        return self._ops.moe_route(
            router_logits.float().contiguous(),
            correction_bias.float().contiguous() if sigmoid else None,
            routing.top_k,
            sigmoid,
            routing.renormalize,
            routing.num_groups,
            routing.topk_groups,
            routing.scaling,
        )

    def experts(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        routed: ExpertWeights,
        shared: ExpertWeights | None = None,
    ) -> torch.Tensor:
        def tag(t: int | None) -> int:
            return BF16 if t is None else t

        if shared is not None and not shared.plain_swiglu:
            biased = shared.w13_bias is not None or shared.w2_bias is not None
            raise ValueError(
                "cpu_fused MoE: a shared expert runs as plain SwiGLU (silu, no biases); got activation "
                f"{shared.activation.name!r}{' with biases' if biased else ''}"
            )

        def bias(b: torch.Tensor | None) -> torch.Tensor | None:
            return None if b is None else b.contiguous()

        return self._ops.moe_experts(
            x.contiguous(),
            topk_weights,
            topk_ids,
            routed.w13,
            tag(routed.w13_type),
            routed.w2,
            tag(routed.w2_type),
            None if shared is None else shared.w13,
            tag(shared.w13_type if shared else None),
            None if shared is None else shared.w2,
            tag(shared.w2_type if shared else None),
            routed.slots,
            self.ggml_int8_activations,
            bias(routed.w13_bias),
            bias(routed.w2_bias),
            _ACTIVATIONS[routed.activation.name],
            routed.activation.alpha,
            routed.activation.limit,
        )
