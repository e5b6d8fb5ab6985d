"""kernels/weight_quant.py: int8 per-channel and int4 group-wise weights in Q8_0 / Q4_1 blocks.

The blocks' dequantization (ggml_quant.dequantize, and the gguf package's, an independent
reader of the layout) must be exactly the per-channel / group-wise formula with the stored fp16
scales, and every element within half a step of the weight it came from.
"""

import numpy as np
import pytest
import torch

from tacit.kernels.ggml_quant import GGML_TYPES, dequantize
from tacit.kernels.weight_quant import (
    Q4_1,
    Q8_0,
    int4_groupwise_params,
    int8_groupwise_params,
    int8_per_channel_params,
    pack_q4_1,
    quantize_int4_groupwise,
    quantize_int8_groupwise,
    quantize_int8_per_channel,
)

SHAPES = [(1, 32), (7, 96), (13, 384), (3, 640)]  # odd row counts; cols whole 32/64/128 groups where used


def weights(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * 0.05
    w[0, :3] = torch.tensor([0.7, -0.9, 0.3])  # an outlier row
    return w


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_round_trip_is_the_per_channel_formula(shape):
    w = weights(shape)
    t = quantize_int8_per_channel(w)
    assert t.ggml_type == Q8_0 and t.shape == shape and t.data.dtype == torch.uint8
    q, d = int8_per_channel_params(w)
    want = q.float() * d.float().unsqueeze(1)  # per output channel: one scale a row
    got = dequantize(t.data, Q8_0, shape[1])
    assert torch.equal(got, want)
    assert int(q.abs().max()) <= 127
    # d = max|row| / 127, rounded up to fp16; so every element is within d / 2
    scale = w.abs().amax(dim=1) / 127
    assert (d.float() >= scale).all() and (d.float() <= scale * (1 + 2**-10)).all()
    assert ((got - w).abs() <= d.float().unsqueeze(1) / 2 * (1 + 1e-6)).all()


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] % 128 == 0] + [(5, 128), (2, 256)])
def test_int8_group_round_trip_is_the_group_wise_formula(shape, group):
    w = weights(shape, seed=group)
    w[-1, -group:] *= 0.1  # a quiet last group: its own scale, ~10x finer than the row's
    t = quantize_int8_groupwise(w, group)
    assert t.ggml_type == Q8_0 and t.shape == shape
    q, d = int8_groupwise_params(w, group)
    assert d.shape == (shape[0], shape[1] // group) and int(q.abs().max()) <= 127
    scale = d.float().repeat_interleave(group, 1)
    got = dequantize(t.data, Q8_0, shape[1])
    assert torch.equal(got, q.float() * scale)
    # d = max|group| / 127 rounded up to fp16: every element within half its group's step
    want_d = w.reshape(shape[0], -1, group).abs().amax(2) / 127
    assert (d.float() >= want_d).all() and (d.float() <= want_d * (1 + 2**-10)).all()
    assert ((got - w).abs() <= scale / 2 * (1 + 1e-6)).all()
    if shape[1] > group:  # the quiet group is rounded on its own finer grid, not on the row's
        quiet = (got - w)[-1, -group:].abs().max()
        assert quiet < (quantize_int8_per_channel(w).dequantize() - w)[-1, -group:].abs().max() / 4


def test_int8_group_32_is_llama_cpp_q8_0():
    """Group 32 is GGML's own Q8_0: the gguf package's quantizer writes the same blocks (its
    scale is max|block| / 127 in fp16 as well; it rounds the scale to nearest where tacit rounds
    up, so codes may differ by one step where that matters; the values agree within a step)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    w = weights((6, 256))
    theirs = torch.from_numpy(gguf_quantize(w.numpy(), GGMLQuantizationType.Q8_0).copy())
    ours = quantize_int8_groupwise(w, 32)
    step = int8_groupwise_params(w, 32)[1].float().repeat_interleave(32, 1)
    assert theirs.shape == ours.data.shape
    diff = (dequantize(theirs, Q8_0, 256) - ours.dequantize()).abs()
    assert (diff <= step * (1 + 1e-3)).all()


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] % 128 == 0] + [(5, 128), (2, 256)])
def test_int4_round_trip_is_the_group_wise_formula(shape, group):
    w = weights(shape, seed=group)
    t = quantize_int4_groupwise(w, group)
    assert t.ggml_type == Q4_1 and t.shape == shape
    q, d, m = int4_groupwise_params(w, group)
    assert d.shape == m.shape == (shape[0], shape[1] // group) and int(q.max()) <= 15
    scale, mn = d.float().repeat_interleave(group, 1), m.float().repeat_interleave(group, 1)
    want = q.float() * scale + mn
    got = dequantize(t.data, Q4_1, shape[1])
    assert torch.equal(got, want)
    assert ((got - w).abs() <= scale / 2 * (1 + 1e-5) + 1e-7).all()
    # each group's range [min, max] lies within [m, m + 15 d]
    g = w.reshape(shape[0], -1, group)
    assert (m.float() <= g.amin(2)).all() and (m.float() + 15 * d.float() >= g.amax(2) * (1 - 1e-6)).all()


def test_blocks_read_the_same_in_the_gguf_package():
    """An independent reader of the Q8_0 / Q4_1 layout agrees element for element."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    w = weights((6, 256))
    for t, qtype in [
        (quantize_int8_per_channel(w), GGMLQuantizationType.Q8_0),
        (quantize_int4_groupwise(w, 64), GGMLQuantizationType.Q4_1),
    ]:
        theirs = torch.from_numpy(gguf_dequantize(t.data.numpy(), qtype).astype(np.float32))
        assert torch.allclose(theirs, t.dequantize(), rtol=0, atol=1e-7)


def test_zero_and_constant_rows_have_no_nan():
    w = weights((4, 128))
    w[1] = 0.0
    w[2] = 0.25  # constant: an int4 group of range 0
    w[3] = torch.linspace(-1e-6, 1e-6, 128)  # a tiny range: fp16 subnormal steps rather than a scale of 0
    for t in (quantize_int8_per_channel(w), *(quantize_int4_groupwise(w, g) for g in (32, 64, 128))):
        got = t.dequantize()
        assert torch.isfinite(got).all()
        assert torch.equal(got[1], torch.zeros(128))
        assert (got[3] - w[3]).abs().max() < 1e-7 and got[3].abs().max() > 5e-7  # steps of 6e-8 to 1.8e-7
        # int4's m is exactly a constant group's fp16 value; int8 is within half its step
        assert (got[2] - 0.25).abs().max() <= (0 if t.ggml_type == Q4_1 else 0.25 / 127 / 2 * 1.01)
    q, d = int8_per_channel_params(w)
    assert d[1] == 0 and (q[1] == 0).all()


def test_bf16_input_is_quantized_in_float32():
    w = weights((3, 64)).bfloat16()
    assert torch.equal(quantize_int8_per_channel(w).data, quantize_int8_per_channel(w.float()).data)
    assert torch.equal(quantize_int4_groupwise(w, 32).data, quantize_int4_groupwise(w.float(), 32).data)


def test_sizes_per_weight():
    # 8.5 and 5 bits a weight whatever the group: the repeated fp16 scale (see the module docstring)
    w = weights((4, 256))
    assert quantize_int8_per_channel(w).data.numel() * 8 / w.numel() == 8.5
    for g in (32, 64, 128):
        assert quantize_int8_groupwise(w, g).data.numel() * 8 / w.numel() == 8.5
    for g in (32, 64, 128):
        assert quantize_int4_groupwise(w, g).data.numel() * 8 / w.numel() == 5.0
    assert GGML_TYPES[Q8_0].block_bytes == 34 and GGML_TYPES[Q4_1].block_bytes == 20


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="int4 group size 48 is not supported; valid: 32, 64, 128"):
        quantize_int4_groupwise(weights((2, 96)), 48)
    with pytest.raises(ValueError, match="int4: rows of 80 values are not whole groups of 64"):
        quantize_int4_groupwise(weights((2, 80)), 64)
    with pytest.raises(ValueError, match="int8: rows of 40 values are not whole groups of 32"):
        quantize_int8_per_channel(weights((2, 40)))
    with pytest.raises(ValueError, match="int8: rows of 96 values are not whole groups of 64"):
        quantize_int8_groupwise(weights((2, 96)), 64)
    with pytest.raises(ValueError, match="int8 group size 16 is not supported; valid: 32, 64, 128"):
        quantize_int8_groupwise(weights((2, 96)), 16)
    with pytest.raises(ValueError, match="too large for an fp16 scale"):
        quantize_int8_per_channel(torch.full((1, 32), 1e7))
    with pytest.raises(ValueError, match="2-D"):
        quantize_int8_per_channel(torch.zeros(32))


def test_packing_takes_transposed_one_group_scales():
    """A [N, 1] view of a [1, N] tensor counts as contiguous with a last stride of N (GPTQ/AWQ
    scales of one group, transposed): the packer still reads its fp16 bytes in order."""
    q, d, m = int4_groupwise_params(weights((6, 128)), 128)
    d_t, m_t = (x.reshape(-1).as_strided((6, 1), (1, 6)) for x in (d, m))
    assert d_t.stride(-1) != 1
    assert torch.equal(pack_q4_1(q, d_t, m_t), pack_q4_1(q, d.clone(), m.clone()))
