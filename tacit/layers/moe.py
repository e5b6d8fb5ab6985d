"""Sparse MoE layer: a router, expert weights stacked per projection, and a MoEKernel."""

from __future__ import annotations

import torch
from torch import nn

from tacit.kernels.moe_kernel import MoEKernel
from tacit.kernels.torch_moe import TorchMoEKernel


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


class FusedMoE(nn.Module):
    """Expert weights as [E, 2I, H] (gate and up fused) and [E, H, I], loaded from HF's
    per-expert `experts.{e}.{gate,up,down}_proj.weight` names by weight_loader."""

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int, kernel: MoEKernel | None = None
    ) -> None:
        super().__init__()
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.kernel = kernel or TorchMoEKernel()
        self._loaded: set[tuple[int, str]] = set()

    def load_expert_weight(self, expert: int, proj: str, weight: torch.Tensor) -> None:
        inter = self.intermediate_size
        with torch.no_grad():
            if proj == "gate_proj":
                self.w13[expert, :inter].copy_(weight)
            elif proj == "up_proj":
                self.w13[expert, inter:].copy_(weight)
            elif proj == "down_proj":
                self.w2[expert].copy_(weight)
            else:
                raise KeyError(proj)
        self._loaded.add((expert, proj))

    def check_fully_loaded(self, name: str) -> None:
        missing = self.num_experts * 3 - len(self._loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {missing} expert projection(s) of {name}")

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.w13, self.w2, topk_weights, topk_ids)
