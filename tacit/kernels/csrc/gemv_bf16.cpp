// bf16 weight x (1..8 rows of activations) for decode on x86 CPUs with AVX512-BF16.
//
// Decode streams every weight once per token, so the kernel's only job is to keep the
// memory bus busy: weight rows are split across threads and each thread reads its rows as one
// sequential stream, a whole row at a time, with up to 8 activation rows (a batch of 8
// decodes) multiplied against each weight load so each weight byte is read once for all of
// them. Why one row at a time: the earlier kernel walked 4 weight rows side by side (4
// interleaved streams, a software prefetch 8 rows ahead) and streamed 22-27 GB/s on this
// Zen 4 host where one sequential stream reached 30-36 GB/s with 2 threads (rows of 384, 576
// and 1024 values, 2.1 GB cycled so every pass comes from DRAM; at 2048 they tie), as
// llama.cpp's vec_dot_bf16 does. Independent accumulators along the row (4 at one activation
// row, 2 at two) keep the dot products from waiting on vdpbf16ps's latency. Past 8 rows the
// math, not memory, limits it (12 rows: 18.4 ms against oneDNN's 16.3 ms for SmolLM2's layer
// weights; the script is in docs/benchmarks.md), so callers switch to oneDNN there.
#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>

#include "bf16_common.h"

namespace tacit {
namespace {

// One weight row x M activation rows, U accumulators per activation row along the row
// (each covering every U-th 32-value chunk), summed at the end.
template <int M, int U>
inline void row_kernel(const uint16_t* wr, const uint16_t* x, float* y, int64_t n, int64_t r, int64_t k) {
  const int64_t step = 32 * U, kU = k - k % step, k32 = k - k % 32;
  __m512 acc[U][M];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < M; ++m) acc[u][m] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i < kU; i += step) {
    for (int u = 0; u < U; ++u) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + i + 32 * u);
      for (int m = 0; m < M; ++m)
        acc[u][m] = _mm512_dpbf16_ps(acc[u][m], wv, (__m512bh)_mm512_loadu_si512(x + m * k + i + 32 * u));
    }
  }
  for (; i < k32; i += 32) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + i);
    for (int m = 0; m < M; ++m)
      acc[0][m] = _mm512_dpbf16_ps(acc[0][m], wv, (__m512bh)_mm512_loadu_si512(x + m * k + i));
  }
  for (int m = 0; m < M; ++m) {
    __m512 sum = acc[0][m];
    for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[u][m]);
    float s = _mm512_reduce_add_ps(sum);
    for (int64_t j = k32; j < k; ++j) s += bf16_to_float(wr[j]) * bf16_to_float(x[m * k + j]);
    y[m * n + r] = s;
  }
}

template <int M>
void rows_kernel(const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t row_begin, int64_t row_end,
                 int64_t k) {
  constexpr int U = M == 1 ? 4 : (M == 2 ? 2 : 1);
  for (int64_t r = row_begin; r < row_end; ++r) row_kernel<M, U>(w + r * k, x, y, n, r, k);
}

template <int... Ms>
void dispatch_rows(int m, const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end,
                   int64_t k) {
  ((m == Ms ? rows_kernel<Ms>(w, x, y, n, begin, end, k) : void()), ...);
}

}  // namespace

void gemv_bf16(const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t k, int m) {
  const int threads = std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>((n + 63) / 64)));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Each thread one contiguous run of rows, one sequential stream; runs of 16 rows each, so
    // two threads' outputs meet on a cache-line boundary of y (a 64-byte-aligned y and n).
    const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
    const int64_t begin = std::min<int64_t>(n, t * per), end = std::min<int64_t>(n, begin + per);
    if (begin < end) dispatch_rows<1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k);
  }
}

void gemv_bf16_rows(const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end, int64_t k,
                    int m) {
  dispatch_rows<1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k);
}

// weight [N, K] bf16 contiguous, x [M, K] bf16 contiguous with 1 <= M <= 8 -> [M, N] bf16
// (accumulated in fp32, rounded once).
torch::Tensor gemm_bf16_skinny(torch::Tensor weight, torch::Tensor x) {
  TORCH_CHECK(weight.scalar_type() == torch::kBFloat16 && x.scalar_type() == torch::kBFloat16, "bf16 only");
  TORCH_CHECK(weight.is_contiguous() && x.is_contiguous() && weight.dim() == 2 && x.dim() == 2, "layout");
  const int64_t n = weight.size(0), k = weight.size(1), m = x.size(0);
  TORCH_CHECK(x.size(1) == k && m >= 1 && m <= kMaxSkinnyRows, "shape: x must be [1..8, K]");
  auto out = torch::empty({m, n}, torch::dtype(torch::kFloat32));
  gemv_bf16(reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()),
            reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), out.data_ptr<float>(), n, k,
            static_cast<int>(m));
  return out.to(torch::kBFloat16);
}

}  // namespace tacit
