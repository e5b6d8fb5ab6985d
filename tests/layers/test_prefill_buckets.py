"""Prefill GEMMs see a bounded set of row counts (padded up, the padding sliced off), so native
memory kept per GEMM shape stops growing with every new prompt length."""

import math

import torch
import torch.nn.functional as F

from tacit.layers import linear_method
from tacit.layers.linear_method import dense_matmul, prefill_rows_bucket


def test_buckets_are_few_and_pad_at_most_a_sixteenth():
    rows = range(33, 8193)
    buckets = {prefill_rows_bucket(r) for r in rows}
    assert all(r <= prefill_rows_bucket(r) <= math.ceil(r * 1.0625) for r in rows)
    assert len(buckets) == 16 * int(math.log2(8192 / 32))  # 16 an octave
    assert all(prefill_rows_bucket(b) == b for b in buckets)  # a bucket is its own bucket


def test_padded_product_equals_the_unpadded_one_and_the_gemm_sees_only_buckets(monkeypatch):
    seen = []
    linear = F.linear

    def recording_linear(x, w, b=None):
        seen.append(x.shape[0])
        return linear(x, w, b)

    monkeypatch.setattr(linear_method.F, "linear", recording_linear)
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(48, 40, generator=g), torch.randn(48, generator=g)
    for rows in (33, 37, 64, 65, 100, 129, 1000):
        x = torch.randn(rows, 40, generator=g)
        out = dense_matmul(w, x, bias)
        assert out.shape == (rows, 48) and out.is_contiguous()
        torch.testing.assert_close(out, x @ w.T + bias, rtol=1e-5, atol=1e-5)
    assert seen == [prefill_rows_bucket(r) for r in (33, 37, 64, 65, 100, 129, 1000)]
