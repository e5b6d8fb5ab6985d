"""Reference MoE: sort token-slots by expert, one dense GEMM pair per expert that got tokens.

Sorting turns T*K scattered rows into E contiguous segments, so the loop runs over experts
(tens to hundreds), never over tokens or requests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tacit.kernels.moe_kernel import MoEKernel, register_moe_kernel


@register_moe_kernel("torch")
class TorchMoEKernel(MoEKernel):
    def __call__(
        self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        num_tokens, top_k = topk_ids.shape
        flat_ids = topk_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        token_index = order // top_k
        counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
        xs = x[token_index]
        out = torch.empty(xs.shape[0], w2.shape[1], dtype=x.dtype, device=x.device)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            seg = xs[start : start + count]
            gate, up = F.linear(seg, w13[expert]).chunk(2, dim=-1)
            out[start : start + count] = F.linear(F.silu(gate) * up, w2[expert])
            start += count
        weights = topk_weights.reshape(-1)[order].to(out.dtype)
        result = torch.zeros(num_tokens, w2.shape[1], dtype=x.dtype, device=x.device)
        return result.index_add_(0, token_index, out * weights[:, None])
