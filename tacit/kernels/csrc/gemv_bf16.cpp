// bf16 matrix-vector product for batch-1 decode on x86 CPUs with AVX512-BF16.
//
// Decode streams every weight once per token, so the kernel's only job is to keep the
// memory bus busy: rows are split across threads, each thread walks 4 rows at a time so
// one load of x feeds 4 vdpbf16ps, and weights are read exactly once, in order.
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

namespace {

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

void gemv_rows(const uint16_t* w, const uint16_t* x, float* y, int64_t row_begin, int64_t row_end, int64_t k) {
  const int64_t k32 = k - k % 32;
  int64_t r = row_begin;
  for (; r + 4 <= row_end; r += 4) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
    const uint16_t* w0 = w + r * k;
    const uint16_t* w1 = w0 + k;
    const uint16_t* w2 = w1 + k;
    const uint16_t* w3 = w2 + k;
    for (int64_t i = 0; i < k32; i += 32) {
      // Prefetch 4 rows ahead: the next block of rows, so DRAM requests overlap the math.
      _mm_prefetch(reinterpret_cast<const char*>(w0 + 8 * k + i), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w1 + 8 * k + i), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w2 + 8 * k + i), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w3 + 8 * k + i), _MM_HINT_T0);
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i);
      acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(w0 + i), xv);
      acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_loadu_si512(w1 + i), xv);
      acc2 = _mm512_dpbf16_ps(acc2, (__m512bh)_mm512_loadu_si512(w2 + i), xv);
      acc3 = _mm512_dpbf16_ps(acc3, (__m512bh)_mm512_loadu_si512(w3 + i), xv);
    }
    float s0 = hsum(acc0), s1 = hsum(acc1), s2 = hsum(acc2), s3 = hsum(acc3);
    for (int64_t i = k32; i < k; ++i) {
      float xi = bf16_to_float(x[i]);
      s0 += bf16_to_float(w0[i]) * xi;
      s1 += bf16_to_float(w1[i]) * xi;
      s2 += bf16_to_float(w2[i]) * xi;
      s3 += bf16_to_float(w3[i]) * xi;
    }
    y[r] = s0; y[r + 1] = s1; y[r + 2] = s2; y[r + 3] = s3;
  }
  for (; r < row_end; ++r) {
    __m512 acc = _mm512_setzero_ps();
    const uint16_t* wr = w + r * k;
    for (int64_t i = 0; i < k32; i += 32) {
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(wr + i), (__m512bh)_mm512_loadu_si512(x + i));
    }
    float s = hsum(acc);
    for (int64_t i = k32; i < k; ++i) s += bf16_to_float(wr[i]) * bf16_to_float(x[i]);
    y[r] = s;
  }
}

}  // namespace

// weight [N, K] bf16 contiguous, x [K] bf16 contiguous -> [N] bf16 (accumulated in fp32).
torch::Tensor gemv_bf16(torch::Tensor weight, torch::Tensor x) {
  TORCH_CHECK(weight.scalar_type() == torch::kBFloat16 && x.scalar_type() == torch::kBFloat16, "bf16 only");
  TORCH_CHECK(weight.is_contiguous() && x.is_contiguous() && weight.dim() == 2 && x.dim() == 1, "layout");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(x.size(0) == k, "shape mismatch");
  auto out = torch::empty({n}, torch::dtype(torch::kFloat32));
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  const auto* xv = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  float* y = out.data_ptr<float>();
  const int threads = std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>((n + 63) / 64)));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Chunks are multiples of 4 rows so the 4-row inner kernel covers almost everything.
    const int64_t per = ((n + nt - 1) / nt + 3) / 4 * 4;
    const int64_t begin = std::min<int64_t>(n, t * per), end = std::min<int64_t>(n, begin + per);
    if (begin < end) gemv_rows(w, xv, y, begin, end, k);
  }
  return out.to(torch::kBFloat16);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv_bf16", &gemv_bf16, "bf16 GEMV (AVX512-BF16)"); }
