// bf16 weight x (1..8 rows of activations) for decode on x86 CPUs with AVX512-BF16.
//
// Decode streams every weight once per token, so the kernel's only job is to keep the
// memory bus busy: weight rows are split across threads, each thread walks 4 weight rows at
// a time so each load of an activation feeds 4 vdpbf16ps, and with up to 8 activation rows
// (a batch of 8 decodes) each weight byte is read once for all of them; past 4 rows it walks
// 2 weight rows at a time so the accumulators still fit in registers. Prefetching 8 rows
// ahead overlaps DRAM latency with the math. Past 8 rows the math, not memory, limits it
// (12 rows: 18.4 ms against oneDNN's 16.3 ms for SmolLM2's layer weights; the script is in
// docs/benchmarks.md), so callers switch to oneDNN there.
#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>

#include "bf16_common.h"

namespace tacit {
namespace {

// R weight rows x M activation rows: each weight load feeds M vdpbf16ps and each activation
// load feeds R, with R * M accumulators kept in registers (at most 16 of the 32 zmm).
template <int R, int M>
inline void tile_kernel(const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t r, int64_t k) {
  const int64_t k32 = k - k % 32;
  __m512 acc[R][M];
  for (int j = 0; j < R; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  const uint16_t* wr = w + r * k;
  for (int64_t i = 0; i < k32; i += 32) {
    for (int j = 0; j < R; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr + (8 + j) * k + i), _MM_HINT_T0);
    __m512bh wv[R];
    for (int j = 0; j < R; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(wr + j * k + i);
    for (int m = 0; m < M; ++m) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * k + i);
      for (int j = 0; j < R; ++j) acc[j][m] = _mm512_dpbf16_ps(acc[j][m], wv[j], xv);
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int m = 0; m < M; ++m) {
      float s = _mm512_reduce_add_ps(acc[j][m]);
      for (int64_t i = k32; i < k; ++i) s += bf16_to_float(wr[j * k + i]) * bf16_to_float(x[m * k + i]);
      y[m * n + r + j] = s;
    }
  }
}

template <int M>
void rows_kernel(const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t row_begin, int64_t row_end,
                 int64_t k) {
  constexpr int R = M <= 4 ? 4 : 2;
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) tile_kernel<R, M>(w, x, y, n, r, k);
  for (; r < row_end; ++r) tile_kernel<1, M>(w, x, y, n, r, k);
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
    // Chunks are multiples of 4 rows so the 4-row inner kernel covers almost everything.
    const int64_t per = ((n + nt - 1) / nt + 3) / 4 * 4;
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
