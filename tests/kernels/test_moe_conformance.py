"""Every registered MoEKernel against the plain definition: sum_k w_k * down(silu(gate x) * up x)."""

import pytest
import torch
import torch.nn.functional as F

import tacit.kernels.torch_moe  # noqa: F401  (registers the reference kernel)
from tacit.kernels.moe_kernel import MOE_KERNELS


def dense_reference(x, w13, w2, weights, ids):
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = F.linear(x[t].double(), w13[e].double()).chunk(2)
            out[t] += float(weights[t, k]) * F.linear(F.silu(gate) * up, w2[e].double())
    return out


def test_the_reference_kernel_is_registered():
    assert "torch" in MOE_KERNELS


@pytest.mark.parametrize("name", sorted(MOE_KERNELS))
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (7, 8, 2), (33, 16, 4), (5, 4, 4)])
def test_moe_kernel_matches_the_definition(name, tokens, experts, top_k):
    g = torch.Generator().manual_seed(tokens * 100 + experts)
    hidden, inter = 24, 40
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.2
    logits = torch.randn(tokens, experts, generator=g)
    weights, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
    got = MOE_KERNELS[name]()(x, w13, w2, weights, ids)
    torch.testing.assert_close(got.double(), dense_reference(x, w13, w2, weights, ids), rtol=1e-4, atol=1e-4)
