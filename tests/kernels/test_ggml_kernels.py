"""csrc/ggml_gemv.cpp against the oracle: the gguf package's dequantize, then an fp32 matmul.

Error bound: the kernel rounds each dequantized weight to bf16 (|dw| <= 2^-9 |w|), sums in
fp32 and rounds the result to bf16 once (<= 2^-9 |y|); so |y - y_ref| <= 2^-9 sum|w||x| +
2^-9 |y_ref| + fp32 summation error. The tests allow twice each term.
"""

import os

import numpy as np
import pytest
import torch

from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels
from tacit.kernels.ggml_quant import FP8_E4M3, GGML_TYPES, MXFP4, GGMLTensor, dequantize
from tacit.layers.ggml_linear_method import GGMLLinearMethod
from tacit.layers.linear import Linear

pytestmark = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)
TYPES = sorted(GGML_TYPES)


Q4_K, Q5_K, Q6_K = 12, 13, 14
# Where a K-quant block keeps its fp16 scales (Q4_K, Q5_K: d, dmin first; Q6_K: d last).
_K_SCALES = {Q4_K: (0, 4), Q5_K: (0, 4), Q6_K: (208, 210)}


def quantized(ggml_type: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 blocks, the oracle's float32 [n, k]) for a random matrix, quantized by the gguf
    package; K-quants, which it cannot quantize, as random blocks with small finite scales;
    FP8_E4M3 (not a gguf type) as random finite e4m3 codes beside random fp32 block scales,
    the oracle torch's own float8_e4m3fn values times the scale."""
    import gguf
    from gguf.quants import dequantize as gguf_dequantize
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    if ggml_type == FP8_E4M3:
        codes = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x7E  # 0x7F / 0xFF are NaN
        scales = rng.uniform(0.001, 0.01, size=(n, k // 32)).astype(np.float32)
        values = torch.from_numpy(codes).view(torch.float8_e4m3fn).float()
        values = values * torch.from_numpy(scales).repeat_interleave(32, dim=1)
        blocks = np.concatenate([scales.view(np.uint8).reshape(n, -1, 4), codes.reshape(n, -1, 32)], axis=2)
        return torch.from_numpy(blocks.reshape(n, -1)), values
    qtype = gguf.GGMLQuantizationType(ggml_type)
    if ggml_type in _K_SCALES:
        t = GGML_TYPES[ggml_type]
        q = rng.integers(0, 256, size=(n, k // 256, t.block_bytes), dtype=np.uint8)
        a, b = _K_SCALES[ggml_type]
        q[..., a:b] = rng.uniform(0.002, 0.02, size=(n, k // 256, (b - a) // 2)).astype(np.float16).view(np.uint8)
        q = q.reshape(n, -1)
    else:
        q = quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    return torch.from_numpy(q), torch.from_numpy(gguf_dequantize(q, qtype))


def within_bound(y: torch.Tensor, x: torch.Tensor, w_ref: torch.Tensor) -> bool:
    ref = x.float() @ w_ref.T
    bound = (x.float().abs() @ w_ref.abs().T) * 2**-8 + ref.abs() * 2**-8 + 1e-6
    return bool(((y.float() - ref).abs() <= bound).all())


SHAPES = [(1, 32), (7, 96), (13, 64), (257, 576), (64, 1536)]
SHAPES_256 = [(1, 256), (7, 512), (257, 1536)]  # K-quant rows are whole 256-value blocks


def type_shapes(types: list[int]) -> list:
    """(type, n, k) for each type over the shapes its blocks allow."""
    return [
        pytest.param(t, n, k, id=f"{GGML_TYPES[t].name}-{n}x{k}")
        for t in types
        for n, k in (SHAPES_256 if t in _K_SCALES else SHAPES)
    ]


@pytest.mark.parametrize("ggml_type, n, k", type_shapes(TYPES))
def test_gemv_matches_oracle_at_1_to_8_rows(ggml_type, n, k):
    """bf16 activations (int8_activations=False): the int8 path's own bound is the test below."""
    kernels = load_cpu_kernels()
    assert kernels is not None, "the kernels failed to build on a CPU that supports them"
    blocks, w_ref = quantized(ggml_type, n, k, seed=n * 7 + k)
    assert torch.equal(dequantize(blocks, ggml_type, k), w_ref)  # the torch reference is the oracle, bit for bit
    g = torch.Generator().manual_seed(n + k)
    for m in range(1, 9):
        x = torch.randn(m, k, generator=g).bfloat16()
        y = kernels.gemm_ggml_skinny(blocks, ggml_type, x, False)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        assert within_bound(y, x, w_ref), f"{GGML_TYPES[ggml_type].name} m={m}"


def int8_activation_bound(x: torch.Tensor, w_ref: torch.Tensor, block: int) -> torch.Tensor:
    """What rounding each block of x to int8 (scale max|x_block| / 127) may add: half a step,
    max|x_block| / 254, per value, times |w|; plus the output's bf16 rounding."""
    m, k = x.shape
    step = x.float().abs().reshape(m, k // block, block).amax(dim=2).repeat_interleave(block, dim=1) / 254
    ref = x.float() @ w_ref.T
    return step @ w_ref.abs().T * 1.01 + ref.abs() * 2**-8 + 1e-5


def int8_rounded(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as the int8 path sees it: each block q * dx, dx = max|x_block| / 127 and
    q = x * (127 / max|x_block|) rounded half to even (a true division: torch's `127.0 / t` is
    a reciprocal times 127, an ulp off, which moved ties like 63.5 to 63)."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // block, block)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, torch.div(torch.full_like(amax, 127.0), amax), torch.zeros_like(amax))
    return (torch.round(blocks * inv) * (amax / 127.0)).reshape(m, k)


INT8_TYPES = [2, 3, 6, 8, MXFP4, Q4_K, Q5_K, Q6_K]  # csrc/ggml_gemv.cpp rows_kernel


@pytest.mark.parametrize("ggml_type, n, k", type_shapes(INT8_TYPES))
def test_decode_rows_round_activations_to_int8_per_block(ggml_type, n, k):
    """Q4_0, Q4_1, Q5_0, Q8_0, MXFP4 with 1-4 rows and the K-quants with 1-8 take llama.cpp's arithmetic
    with int8_activations (activations as int8 per 32-value block, q8_0; the K-quants per
    256-value super-block, q8_K), compared here with the bf16 path (int8_activations=False)."""
    block = 256 if ggml_type in _K_SCALES else 32
    kernels = load_cpu_kernels()
    blocks, w_ref = quantized(ggml_type, n, k, seed=n + k)
    g = torch.Generator().manual_seed(n * k)
    for m in range(1, 9):
        x = torch.randn(m, k, generator=g).bfloat16()
        ref = x.float() @ w_ref.T
        bf16 = kernels.gemm_ggml_skinny(blocks, ggml_type, x, False).float()
        assert within_bound(bf16, x, w_ref)
        int8 = kernels.gemm_ggml_skinny(blocks, ggml_type, x, True).float()
        assert ((int8 - ref).abs() <= int8_activation_bound(x, w_ref, block)).all(), f"m={m}"
        int8_rows = m <= 4 or ggml_type in _K_SCALES
        if int8_rows:  # and that is all it does: the exact product of the rounded activations, up to
            # the output's bf16 rounding and fp32 sums (a wrong lane, scale or min term is far off)
            xr = int8_rounded(x, block).double()
            exact = xr @ w_ref.double().T
            slack = exact.abs() * 2**-8 + (xr.abs() @ w_ref.double().abs().T) * 1e-6
            assert ((int8.double() - exact).abs() <= slack).all(), f"m={m}"
            # the int8 path ran: rounding x moved some output (n * m values of unit-scale sums)
            assert n * m < 8 or not torch.equal(int8, bf16)
        else:  # 5-8 rows of the others unpack to bf16 either way (csrc/ggml_gemv.cpp rows_kernel)
            assert torch.equal(int8, bf16)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: GGML_TYPES[t].name)
def test_dequantize_is_the_oracle_rounded_to_bf16(ggml_type):
    blocks, w_ref = quantized(ggml_type, 96, 512, seed=ggml_type)
    got = load_cpu_kernels().ggml_dequantize(blocks, ggml_type, 512).float()
    want = w_ref.bfloat16().float()
    # Q4_1's d * q + m (Q4_K/Q5_K's sc * q - m) is one fused multiply-add in the kernel, two roundings
    # in numpy: at most one bf16 ulp apart (2^-8 relative) where they straddle a rounding edge.
    assert ((got - want).abs() <= want.abs() * 2**-8).all()
    if GGML_TYPES[ggml_type].name not in ("Q4_1", "Q4_K", "Q5_K"):
        assert torch.equal(got, want)


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: GGML_TYPES[t].name)
@pytest.mark.parametrize("rows", [1, 5, 8, 20, 32, 40])
def test_layer_with_kernels_matches_torch_reference(ggml_type, rows):
    """GGMLLinearMethod on the kernels (1-8 rows: GEMV; 9-32: GEMV 8 rows a pass, 20 = 8+8+4;
    more: dequantize + oneDNN) against the same layer on the torch reference (kernels=None),
    bias included; bf16 activations (the int8 path's bound is test_decode_rows_round_...)."""
    blocks, w_ref = quantized(ggml_type, 48, 256, seed=rows)
    layers = []
    for kernels in (load_cpu_kernels(), None):
        layer = Linear(256, 48, bias=True, dtype=torch.bfloat16)
        layer.rebuild_weights(GGMLLinearMethod(ggml_type, kernels, int8_activations=False))
        with torch.no_grad():
            layer.weight.copy_(GGMLTensor(blocks, ggml_type, (48, 256)).data)
            layer.bias.copy_(torch.linspace(-1, 1, 48))
        layers.append(layer)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).bfloat16()
    got, ref = layers[0](x), layers[1](x)
    assert got.dtype == ref.dtype == torch.bfloat16 and got.shape == (rows, 48)
    assert within_bound(got - layers[0].bias, x, w_ref)
    # Both multiply the same bf16-rounded weights; only fp32 summation order differs.
    assert torch.allclose(got.float(), ref.float(), rtol=2**-7, atol=2**-7 * ref.abs().max().item())


def test_wrong_sizes_are_refused_with_the_numbers():
    blocks, _ = quantized(3, 8, 64, seed=0)  # Q4_1: 2 blocks of 20 bytes per row
    x = torch.randn(1, 96).bfloat16()
    with pytest.raises(RuntimeError, match="rows hold 40 bytes; K=96 needs 60"):
        load_cpu_kernels().gemm_ggml_skinny(blocks, 3, x, True)
    with pytest.raises(RuntimeError, match="GGML type 10 has no kernel"):  # Q2_K
        load_cpu_kernels().gemm_ggml_skinny(blocks, 10, torch.randn(1, 64).bfloat16(), True)
    with pytest.raises(RuntimeError, match="K=64 is not whole blocks of GGML type 12"):  # Q4_K: 256-value blocks
        load_cpu_kernels().gemm_ggml_skinny(blocks, 12, torch.randn(1, 64).bfloat16(), True)
    with pytest.raises(ValueError, match=r"Q4_1 \[8, 96\] is 8 x 60 bytes; got torch.uint8 \(8, 40\)"):
        GGMLTensor(blocks, 3, (8, 96))


@pytest.mark.parametrize("env, expected", [(None, False), ("1", True)])
def test_env_var_is_the_bf16_activations_fields_default(monkeypatch, env, expected):
    """TACIT_GGML_BF16_ACTIVATIONS=1 still turns int8 activations off, as EngineArgs.ggml_bf16_activations'
    default (tests/engine/test_two_engines_kernel_settings.py: what an explicit setting does)."""
    from tacit.kernels.cpu_kernels import ggml_bf16_activations_default

    if env is None:
        monkeypatch.delenv("TACIT_GGML_BF16_ACTIVATIONS", raising=False)
    else:
        monkeypatch.setenv("TACIT_GGML_BF16_ACTIVATIONS", env)
    assert ggml_bf16_activations_default() is expected


_GUARD_PAGE_SCRIPT = """
import ctypes, mmap, sys
import torch
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.ggml_quant import GGML_TYPES, row_bytes

kernels, page = load_cpu_kernels(), mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
region = mmap.mmap(-1, 3 * page)
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
assert libc.mprotect(ctypes.c_void_p(base + 2 * page), page, 0) == 0  # PROT_NONE: reading it faults
for ggml_type in sorted(GGML_TYPES):
    values = GGML_TYPES[ggml_type].block_values
    for k in sorted({values, 3 * values}):
        n, rb = 3, row_bytes(ggml_type, k)
        start = 2 * page - n * rb  # the weight's last byte is the guard page's neighbour
        weight = torch.frombuffer(region, dtype=torch.uint8, count=n * rb, offset=start).view(n, rb)
        weight.zero_()
        for m in (1, 4, 5):
            out = kernels.gemm_ggml_skinny(weight, ggml_type, torch.ones(m, k, dtype=torch.bfloat16), True)
            assert torch.equal(out, torch.zeros(m, n, dtype=torch.bfloat16)), (ggml_type, k, m)
print("ok")
"""


def test_kernels_never_read_past_the_last_row():
    """Each type's weight flush against an unreadable page, at 1, 4 and 5 activation rows, with
    k one block and three (a short last group of ggml_q4_groups.h's four blocks; its masked loads
    must not touch the bytes past the row): a read past the last row would kill the process."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _GUARD_PAGE_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "ok", out.stderr[-2000:]
