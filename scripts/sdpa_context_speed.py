"""F.scaled_dot_product_attention for a 170-token chunk over a 3,072-token context (SmolLM2-135M's
heads: 9 query over 3 kv, 64 wide, bf16), against repeated kv heads and a bmm + fp32 softmax
(docs/benchmarks.md, "Prefix caching: multi-turn conversations").

Run: python scripts/sdpa_context_speed.py
"""

import time

import torch
import torch.nn.functional as F

Q, L, H, HKV, D = 170, 3072, 9, 3, 64


def bench(f, n: int = 20) -> float:
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1000


def manual(q, k, v, mask):
    g = H // HKV
    s = torch.matmul(q.reshape(1, HKV, g * Q, D), k.transpose(-1, -2)).float() * D**-0.5
    s = s.view(1, HKV, g, Q, L).masked_fill_(~mask[:, :, None], float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1).to(q.dtype).view(1, HKV, g * Q, L), v).view(1, H, Q, D)


def main() -> None:
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(1, H, Q, D, dtype=dt)
    k = torch.randn(1, HKV, L, D, dtype=dt)
    v = torch.randn(1, HKV, L, D, dtype=dt)
    mask = (torch.arange(L)[None, :] <= (L - Q + torch.arange(Q))[:, None])[None, None]
    kr, vr = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
    gqa = bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    rep = bench(lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask))
    man = bench(lambda: manual(q, k, v, mask))
    print(f"sdpa gqa+bool mask {gqa:.2f} ms, repeated kv heads {rep:.2f} ms, bmm + fp32 softmax {man:.2f} ms")
    k2, v2 = k[:, :, :176], v[:, :, :176]
    m2 = (torch.arange(176)[None, :] <= torch.arange(Q)[:, None])[None, None]
    fresh = bench(lambda: F.scaled_dot_product_attention(q, k2, v2, attn_mask=m2, enable_gqa=True))
    print(f"the same chunk with no context: {fresh:.2f} ms")


if __name__ == "__main__":
    main()
