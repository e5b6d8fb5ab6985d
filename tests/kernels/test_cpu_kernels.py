import os

import pytest
import torch

from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels
from tacit.layers.cpu_linear_method import CpuBf16GemvLinearMethod
from tacit.layers.linear import Linear, select_linear_method, use_linear_method

pytestmark = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)


@pytest.mark.parametrize("n, k", [(1, 32), (7, 576), (960, 576), (576, 1536), (13, 100), (4099, 64)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
def test_gemv_matches_fp32_reference(n, k, m):
    kernel = load_cpu_kernels()
    assert kernel is not None, "the kernel failed to build on a CPU that supports it"
    g = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    ref = x.float() @ w.float().T
    got = kernel.gemm_bf16_skinny(w, x).float()
    # Both accumulate in fp32; the result is rounded to bf16 once (8 mantissa bits).
    assert torch.allclose(got, ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


@pytest.mark.parametrize("rows", [1, 3])
def test_linear_uses_kernel_for_few_bf16_rows(rows):
    method = select_linear_method("cpu", torch.bfloat16)
    assert isinstance(method, CpuBf16GemvLinearMethod), "bf16 on an AVX512-BF16 CPU should pick the GEMV kernel"
    layer = Linear(64, 48, bias=True, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 64))
        layer.bias.copy_(torch.randn(48))
    use_linear_method(layer, method)
    assert layer.linear_method is method
    x = torch.randn(rows, 64).bfloat16()
    ref = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    out = layer(x)
    assert out.shape == (rows, 48) and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
