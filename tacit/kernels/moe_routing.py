"""How a sparse MoE layer picks its experts: the routing rule, and its plain-torch reference.

Two rules cover the models tacit runs:
- softmax over every expert, keep the top-k (Qwen3-MoE, Mixtral), optionally renormalised;
- sigmoid scores plus a correction bias pick the experts, only inside the `topk_groups` groups
  whose two best experts score highest, and the bare scores weight them (DeepSeek-V3's
  noaux_tc, Kimi-K2).
Both run in float32: bf16 scores tie often enough to flip an expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class MoERouting:
    top_k: int
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    renormalize: bool = True
    num_groups: int = 1  # sigmoid only: experts fall into this many equal groups ...
    topk_groups: int = 1  # ... of which this many may supply experts
    scaling: float = 1.0  # sigmoid only: routed_scaling_factor, applied to the weights


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE / Mixtral routing: softmax over all experts, keep the top-k."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def grouped_sigmoid_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing (noaux_tc): experts are chosen on sigmoid score + bias, only inside
    the topk_groups groups whose two best experts score highest, but weighted by the bare score."""
    scores = router_logits.float().sigmoid()
    choice = scores + correction_bias
    num_experts = choice.shape[-1]
    grouped = choice.view(-1, num_groups, num_experts // num_groups)
    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_groups, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0).bool()
    expert_mask = group_mask.unsqueeze(-1).expand_as(grouped).reshape(-1, num_experts)
    choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def route_reference(
    router_logits: torch.Tensor, routing: MoERouting, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, K], ids int64 [T, K]) for float32 router logits [T, E]."""
    if routing.scoring == "softmax":
        return softmax_topk(router_logits, routing.top_k, routing.renormalize)
    if correction_bias is None:
        correction_bias = torch.zeros(router_logits.shape[-1], device=router_logits.device)
    return grouped_sigmoid_topk(
        router_logits,
        correction_bias.float(),
        routing.top_k,
        routing.num_groups,
        routing.topk_groups,
        routing.renormalize,
        routing.scaling,
    )
