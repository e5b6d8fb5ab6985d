"""MoEKernel: dispatch tokens to their top-k experts, run the expert GEMMs, combine."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class MoEKernel(ABC):
    @abstractmethod
    def __call__(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I];
        topk_weights/ids [T, K] -> sum_k w_k * expert_k(x) as [T, H]."""
