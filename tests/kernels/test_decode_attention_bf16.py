"""csrc/decode_attention.cpp over a bf16 paged cache against fp32 attention on the same values:
the per-head score tile (groups under 4), the 4-heads x 4-keys tile (groups of 4 and more, with
the leftover heads per head), head dims with masked tails, and MLA's one-kv-head latent rows."""

import pytest
import torch

from tests.kernels.test_kv_int8 import kernels, needs_kernels
from tests.kernels.test_kv_int8 import reference_attention as reference


# The kernel's own roundings: probabilities to bf16 (2^-9 relative) before the V product, and the
# output to bf16: measured at most ~0.4% of the largest output here; 1% leaves room.
def assert_close_to_reference(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got - want).abs().max() <= 1e-2 * want.abs().max() + 1e-3


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "d, heads, kv_heads, bs, ctx",
    [
        (64, 9, 3, 16, 300),  # group 3: per-head tiles only
        (128, 8, 2, 16, 129),  # group 4: the 4-heads tile
        (24, 8, 1, 8, 50),  # group 8, a 24-wide head: masked tails in both tiles
        (80, 12, 2, 4, 71),  # group 6: one 4-heads tile and two single heads per key tile
        (40, 16, 1, 16, 33),
    ],
)
def test_paged_bf16_decode_matches_fp32_attention(d, heads, kv_heads, bs, ctx, threads):
    k = kernels()
    torch.manual_seed(d + ctx)
    nb, m = 64, 3
    cache = torch.randn(2, nb, bs, kv_heads, d).bfloat16()
    q = torch.randn(m, heads, d).bfloat16()
    pos = torch.tensor([ctx - 1, ctx // 2, 0])
    tables = torch.stack([torch.randperm(nb)[: -(-ctx // bs)] for _ in range(m)])
    scale = d**-0.5
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = k.paged_decode_attention(q, cache, pos, tables, scale).float()
        alone = k.paged_decode_attention(q[:1], cache, pos[:1], tables[:1], scale).float()  # heads split over threads
    finally:
        torch.set_num_threads(before)
    keys = cache[0][tables].flatten(1, 2).float()  # [m, blocks * bs, Hkv, D]
    values = cache[1][tables].flatten(1, 2).float()
    for r in range(m):
        n = int(pos[r]) + 1
        assert_close_to_reference(got[r], reference(q[r].float(), keys[r, :n], values[r, :n], scale))
    assert torch.equal(alone[0], got[0])  # one row alone, its heads spread over the threads: same bits


@needs_kernels
@pytest.mark.parametrize("heads", [16, 6])
def test_mla_bf16_decode_matches_fp32_attention(heads):
    k = kernels()
    torch.manual_seed(heads)
    rank, rope, bs, nb, m = 64, 16, 16, 40, 2
    cache = torch.randn(nb, bs, rank + rope).bfloat16()
    q = torch.randn(m, heads, rank + rope).bfloat16()
    pos = torch.tensor([300, 17])
    tables = torch.stack([torch.randperm(nb)[:20] for _ in range(m)])
    got = k.mla_decode_attention(q, cache, pos, tables, 0.1, rank).float()
    rows = cache[tables].flatten(1, 2).float()  # [m, 20 * bs, rank + rope]
    for r in range(m):
        n = int(pos[r]) + 1
        latent = rows[r, :n].unsqueeze(1)
        want = reference(q[r].float(), latent, latent[..., :rank], 0.1)
        assert_close_to_reference(got[r], want)
