"""MoEKernel: route tokens to their top-k experts, run the expert GEMMs, combine.

A kernel is picked once per model (layers/moe.py select_moe_kernel: the lowest priority that
supports the platform and dtype) and handed to every FusedMoE layer. The torch kernel
(kernels/torch_moe.py) is the reference every other one is tested against
(tests/kernels/test_moe_conformance.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from tacit.kernels.moe_routing import MoERouting, route_reference
from tacit.registry import Registry


@dataclass(frozen=True)
class ExpertActivation:
    """How an expert joins the halves of its gate/up product (vLLM's activation names):
    - "silu": silu(gate) * up, the SwiGLU of Llama-family MoEs;
    - "swigluoai": gpt-oss's clamped form, (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)
      with g = min(gate, limit) (transformers' GptOssExperts._apply_gate)."""

    name: Literal["silu", "swigluoai"] = "silu"
    alpha: float = 1.702  # gpt-oss's swiglu_alpha
    limit: float = 7.0  # gpt-oss's swiglu_limit

    def __post_init__(self) -> None:
        if self.name not in ("silu", "swigluoai"):
            raise ValueError(f"expert activation {self.name!r} is not supported; valid: silu, swigluoai")


SILU = ExpertActivation()


@dataclass
class ExpertWeights:
    """A stack of gated experts. w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I] in
    the model's dtype, or, when w13_type / w2_type is a GGML type id (kernels/ggml_quant.py),
    that type's uint8 blocks [E, rows, row_bytes]. A shared expert is a stack of one.
    gpt-oss adds biases (w13_bias [E, 2I] in w13's row order, w2_bias [E, H]) and its own
    activation; only kernels whose supports_experts says so run those."""

    w13: torch.Tensor
    w2: torch.Tensor
    w13_type: int | None = None
    w2_type: int | None = None
    # Expert id -> row of the stacks, when the stacks are a cache's slots (memory/expert_cache.py)
    # or one expert-parallel rank's share, holding only some experts; -1: the expert is another
    # rank's, and its tokens get nothing from it here. None: row e is expert e.
    slots: torch.Tensor | None = None
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    activation: ExpertActivation = SILU

    @property
    def plain_swiglu(self) -> bool:
        """Whether these are biasless silu experts, the form every kernel runs."""
        return self.activation == SILU and self.w13_bias is None and self.w2_bias is None

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0] if self.slots is None else self.slots.shape[0]

    def row(self, expert: int) -> int:
        return expert if self.slots is None else int(self.slots[expert])

    @property
    def intermediate_size(self) -> int:
        return self.w13.shape[1] // 2


class MoEKernel(ABC):
    name: ClassVar[str]
    priority: ClassVar[int]
    # True for a kernel built on tacit's CPU kernels: an engine with cpu_kernels off skips it.
    uses_cpu_kernels: ClassVar[bool] = False
    # How GGML expert stacks multiply where the kernel has the choice (EngineArgs.ggml_bf16_activations,
    # negated; csrc/ggml_gemv.h); set on the instance by layers/moe.select_moe_kernel.
    ggml_int8_activations: bool = True

    @classmethod
    @abstractmethod
    def supports(cls, platform: str, dtype: torch.dtype) -> bool:
        """Whether this kernel runs on `platform` ("cpu", "cuda") with activations in `dtype`."""

    @classmethod
    def supports_experts(cls, experts: ExpertWeights) -> bool:
        """Whether this kernel runs these experts' activation and biases; a layer whose experts a
        kernel declines runs the torch reference (layers/moe.py use_moe_kernel)."""
        return experts.plain_swiglu

    def route(
        self, router_logits: torch.Tensor, routing: MoERouting, correction_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 router logits [T, E] -> (weights float32 [T, K], expert ids int64 [T, K])."""
        return route_reference(router_logits, routing, correction_bias)

    @abstractmethod
    def experts(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        routed: ExpertWeights,
        shared: ExpertWeights | None = None,
    ) -> torch.Tensor:
        """x [T, H] -> sum_k w_k * expert_k(x) (+ shared(x), the shared expert with weight 1) as [T, H]."""


# name -> MoEKernel class; each implementation registers itself with @register_moe_kernel.
MOE_KERNELS = Registry("moe_kernel")
register_moe_kernel = MOE_KERNELS.register
