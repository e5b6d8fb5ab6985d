"""MXFP4 (ggml type 39, gpt-oss's experts): the torch oracle against the gguf package's numpy
arithmetic (llama.cpp's), then the AVX512 kernels against the oracle over every code and a wide
range of exponents, 1-8 activation rows, and the fused MoE kernel on MXFP4 expert stacks.

"Exact" as tests/kernels/test_ggml_kernels.py defines it: at 1-4 rows with int8 activations the
GEMV is the exact product of the int8-rounded activations and the oracle's weights (integer dot
products, power-of-two scales), up to fp32 sums and the output's bf16 rounding; at 5-8 rows (and
with int8 activations off) each weight is unpacked to bf16, which holds every MXFP4 value exactly
(at most 2 significant bits), so only fp32 sums and the output's rounding remain.
"""

import os

import numpy as np
import pytest
import torch

from tacit.kernels.cpu_fused_moe import CPUFusedMoEKernel
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels
from tacit.kernels.ggml_quant import MXFP4, dequantize, e8m0_to_fp32_half
from tacit.kernels.moe_kernel import ExpertWeights
from tacit.kernels.torch_moe import TorchMoEKernel
from tests.kernels.test_ggml_kernels import int8_rounded, within_bound

needs_kernels = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)


def random_blocks(n: int, k: int, seed: int, exponents: tuple[int, int] = (118, 136)) -> torch.Tensor:
    """uint8 [n, k / 32 * 17]: every nibble uniform over the 16 codes (-0 included), exponents
    uniform in [lo, hi], so a row's blocks differ in scale by up to 2^18."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(exponents[0], exponents[1] + 1, size=(n, k // 32))
    return torch.from_numpy(blocks.reshape(n, -1))


def test_oracle_is_llamacpp_arithmetic_for_every_code_and_exponent():
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    blocks = random_blocks(256, 32, seed=1).reshape(256, 17)
    blocks[:, 0] = torch.arange(256, dtype=torch.uint8)  # every exponent, the subnormal 0 and 1 and 255
    blocks[:16, 1:] = (torch.arange(16, dtype=torch.uint8) * 17).repeat(16, 1)[:, :16]  # every code in both nibbles
    with np.errstate(over="ignore"):  # exponent 255 times 12 overflows to inf, in both
        want = torch.from_numpy(gguf_dequantize(blocks.numpy(), gguf.GGMLQuantizationType.MXFP4))
    assert torch.equal(dequantize(blocks, MXFP4, 32), want)
    # 2^(e - 128): the halved scale that pairs with the doubled E2M1 table
    e = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(e8m0_to_fp32_half(e), torch.ldexp(torch.ones(256), e.int() - 128))


@needs_kernels
@pytest.mark.parametrize("n, k", [(1, 32), (5, 96), (16, 64), (8, 512), (33, 320), (130, 2880)])
def test_gemv_is_the_oracles_product_at_1_to_8_rows(n, k):
    """Four blocks a step at 1-4 rows: 8 x 512 whole groups, the rest a short last group (96, 320:
    3 and 2 blocks left; 130 x 2880, gpt-oss's hidden size: 90 blocks a row, 2 left)."""
    kernels = load_cpu_kernels()
    assert kernels is not None
    blocks = random_blocks(n, k, seed=n + k)
    w = dequantize(blocks, MXFP4, k)
    assert torch.equal(kernels.ggml_dequantize(blocks, MXFP4, k).float(), w)  # bf16 holds every value
    g = torch.Generator().manual_seed(n * k)
    for m in range(1, 9):
        x = torch.randn(m, k, generator=g).bfloat16()
        bf16 = kernels.gemm_ggml_skinny(blocks, MXFP4, x, False)
        assert within_bound(bf16, x, w), f"bf16 activations, m={m}"
        int8 = kernels.gemm_ggml_skinny(blocks, MXFP4, x, True).double()
        xr = int8_rounded(x, 32).double() if m <= 4 else x.double()  # 5-8 rows unpack to bf16 either way
        exact = xr @ w.double().T
        slack = exact.abs() * 2**-8 + (xr.abs() @ w.double().abs().T) * 1e-6
        assert ((int8 - exact).abs() <= slack).all(), f"int8 activations, m={m}"
        if m <= 4 and n * m >= 8:  # the int8 path ran: rounding x moved some output
            assert not torch.equal(int8, bf16.double())


@needs_kernels
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_fused_moe_runs_mxfp4_experts(tokens):
    """The cpu_fused kernel on MXFP4 stacks (gpt-oss's layout: [E, rows, row_bytes]) against the
    torch kernel on the same blocks, bf16 activations (the same dequantized arithmetic), and with
    int8 activations within their rounding (a wrong lane or scale is far off)."""
    hidden, inter, experts = 256, 96, 8
    w13 = torch.stack([random_blocks(2 * inter, hidden, seed=e, exponents=(119, 123)) for e in range(experts)])
    w2 = torch.stack([random_blocks(hidden, inter, seed=100 + e, exponents=(119, 123)) for e in range(experts)])
    ew = ExpertWeights(w13, w2, MXFP4, MXFP4)
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    weights, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(4, dim=-1)
    want = TorchMoEKernel().experts(x, weights, ids, ew).float()
    kernel = CPUFusedMoEKernel()
    scale = want.abs().max().item()
    kernel.ggml_int8_activations = False
    assert (kernel.experts(x, weights, ids, ew).float() - want).abs().max().item() <= scale * 2**-6
    kernel.ggml_int8_activations = True
    assert (kernel.experts(x, weights, ids, ew).float() - want).abs().max().item() <= scale * 2**-4
