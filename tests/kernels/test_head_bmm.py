"""csrc/head_bmm.cpp (absorbed MLA's per-head projections at decode) against a float32 bmm.

Each output is an fp32 sum of bf16 products rounded once to bf16, so it lies within a bf16
rounding (2^-8 relative) of the float32 product plus fp32 summation error."""

import os

import pytest
import torch

from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels

pytestmark = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)


@pytest.mark.parametrize(
    "tokens, heads, k, n",
    [(1, 16, 128, 512), (3, 16, 512, 128), (8, 4, 64, 96), (11, 2, 130, 64), (17, 3, 2, 32)],
    ids=["q-absorb", "out-absorb", "8-tokens", "two-passes", "k-2"],
)
def test_matches_float_bmm(tokens, heads, k, n):
    g = torch.Generator().manual_seed(tokens * 100 + k)
    w = torch.randn(heads, k, n, generator=g).bfloat16()
    x = torch.randn(tokens, heads, k + 64, generator=g).bfloat16()[..., :k]  # strided, as q_nope is
    got = load_cpu_kernels().head_bmm_bf16(x, w)
    assert got.shape == (tokens, heads, n) and got.dtype == torch.bfloat16
    ref = torch.bmm(x.transpose(0, 1).float(), w.float()).transpose(0, 1)
    bound = ref.abs() * 2**-8 + torch.bmm(x.transpose(0, 1).float().abs(), w.float().abs()).transpose(0, 1) * 1e-6
    assert ((got.float() - ref).abs() <= bound).all()


def test_shapes_it_cannot_take_are_refused():
    kernels = load_cpu_kernels()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.head_bmm_bf16(torch.zeros(1, 2, 8).bfloat16(), torch.zeros(2, 8, 48).bfloat16())
    with pytest.raises(RuntimeError, match="against w"):
        kernels.head_bmm_bf16(torch.zeros(1, 2, 8).bfloat16(), torch.zeros(3, 8, 32).bfloat16())
