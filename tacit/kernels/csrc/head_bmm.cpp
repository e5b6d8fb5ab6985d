// Per-head products of a few tokens with a bf16 weight stored [H, K, N] (K rows of N outputs):
// out[t, h, :] = x[t, h, :] @ w[h], AVX512-BF16. Absorbed MLA's q_nope @ W_UK and o_latent @ W_UV^T
// at decode (kernels/absorbed_mla_attention.py): torch.bmm ran them at ~15 GB/s of weight
// (random:deepseek-v3-1b, 16 heads x 2 MB a layer, 1.6 ms a token of its 8.9), a third of
// what a stream of them allows.
//
// The weight is read in its stored order: rows i and i + 1 of a 32-output chunk interleaved in
// registers (unpacklo/hi_epi16) so that one vdpbf16ps takes both against the pair (x[i], x[i+1]);
// unpacking works within 128-bit lanes, so accumulator lane j of 128-bit lane L holds output
// 8L + j (lo) or 8L + 4 + j (hi), put back in order once per chunk. fp32 sums, one bf16 rounding
// of each output, as torch.bmm in bf16 rounds.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>

namespace tacit {
namespace {

constexpr int kChunk = 32;   // outputs a work item
constexpr int kMaxTokens = 8;  // tokens a pass over the weight (2 accumulators each)

template <int T>
void chunk_kernel(const uint16_t* x, int64_t x_token_stride, const uint16_t* w, int64_t k, int64_t n, uint16_t* out,
                  int64_t out_token_stride) {
  __m512 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 2) {
    const __m512i a = _mm512_loadu_si512(w + i * n);
    const __m512i b = _mm512_loadu_si512(w + (i + 1) * n);
    const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
    for (int t = 0; t < T; ++t) {
      uint32_t pair;
      std::memcpy(&pair, x + t * x_token_stride + i, 4);
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      acc[t][0] = _mm512_dpbf16_ps(acc[t][0], lo, xp);
      acc[t][1] = _mm512_dpbf16_ps(acc[t][1], hi, xp);
    }
  }
  // outputs 0-15 and 16-31 from (lo, hi): output 8L + j is lo lane 4L + j (j < 4), else hi lane 4L + j - 4
  const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i second = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  for (int t = 0; t < T; ++t) {
    const __m512 o0 = _mm512_permutex2var_ps(acc[t][0], first, acc[t][1]);
    const __m512 o1 = _mm512_permutex2var_ps(acc[t][0], second, acc[t][1]);
    _mm512_storeu_si512(out + t * out_token_stride, (__m512i)_mm512_cvtne2ps_pbh(o1, o0));
  }
}

template <int... Ts>
void dispatch(int tokens, const uint16_t* x, int64_t xs, const uint16_t* w, int64_t k, int64_t n, uint16_t* out,
              int64_t os) {
  ((tokens == Ts ? chunk_kernel<Ts>(x, xs, w, k, n, out, os) : void()), ...);
}

}  // namespace

torch::Tensor head_bmm_bf16(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && w.scalar_type() == torch::kBFloat16 && x.device().is_cpu() &&
                  w.device().is_cpu(),
              "head_bmm_bf16: bf16 CPU tensors");
  TORCH_CHECK(x.dim() == 3 && w.dim() == 3 && w.is_contiguous(), "x [T, H, K], w contiguous [H, K, N]");
  const int64_t tokens = x.size(0), heads = x.size(1), k = x.size(2), n = w.size(2);
  TORCH_CHECK(w.size(0) == heads && w.size(1) == k, "x ", x.sizes(), " against w ", w.sizes());
  TORCH_CHECK(x.stride(2) == 1 && k % 2 == 0 && n % kChunk == 0, "K even, N a multiple of 32, x's K contiguous");
  auto out = torch::empty({tokens, heads, n}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t xs_t = x.stride(0), xs_h = x.stride(1), chunks = n / kChunk;
  at::parallel_for(0, heads * chunks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / chunks, c = (item % chunks) * kChunk;
      for (int64_t t0 = 0; t0 < tokens; t0 += kMaxTokens) {
        const int m = static_cast<int>(std::min<int64_t>(kMaxTokens, tokens - t0));
        dispatch<1, 2, 3, 4, 5, 6, 7, 8>(m, xp + t0 * xs_t + h * xs_h, xs_t, wp + h * k * n + c, k, n,
                                         op + (t0 * heads + h) * n + c, heads * n);
      }
    }
  });
  return out;
}

}  // namespace tacit
