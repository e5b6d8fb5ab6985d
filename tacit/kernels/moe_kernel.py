"""MoEKernel: dispatch tokens to their top-k experts, run the expert GEMMs, combine."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from tacit.registry import Registry


class MoEKernel(ABC):
    name: str

    @abstractmethod
    def __call__(
        self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """x [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I];
        topk_weights/ids [T, K] -> sum_k w_k * expert_k(x) as [T, H]."""


# name -> MoEKernel class; each implementation registers itself with @register_moe_kernel, and the
# conformance test (tests/kernels/test_moe_conformance.py) runs every entry against the reference.
MOE_KERNELS = Registry("moe_kernel")
register_moe_kernel = MOE_KERNELS.register
