// How a bf16 GEMV should walk its weight rows to stream from DRAM (docs/benchmarks.md, "bf16
// GEMV: one sequential stream"). Two access patterns over the same [n, k] bf16 matrix, one
// activation row, OpenMP threads splitting the rows:
//   pattern 0: 4 weight rows side by side (4 interleaved streams), a software prefetch 8 rows
//              ahead: tacit's kernel before this change;
//   pattern 1: one row at a time, 4 accumulators along the row: one sequential stream per
//              thread (csrc/gemv_bf16.cpp now, and llama.cpp's vec_dot_bf16).
// The matrix is cycled through ~2.1 GB of copies so every pass comes from DRAM; thp=1 madvises
// the buffer for 2 MB pages.
//   gcc -O3 -march=cooperlake -fopenmp scripts/gemv_stream_patterns.c -o /tmp/gemv_stream
//   OMP_NUM_THREADS=2 /tmp/gemv_stream K N PATTERN THP
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void four_rows(const uint16_t* w, const uint16_t* x, float* y, int64_t b, int64_t e, int64_t k) {
  for (int64_t r = b; r + 4 <= e; r += 4) {
    const uint16_t* wr = w + r * k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < k; i += 32) {
      for (int j = 0; j < 4; ++j) _mm_prefetch((const char*)(wr + (8 + j) * k + i), _MM_HINT_T0);
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i);
      a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(wr + i), xv);
      a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(wr + k + i), xv);
      a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(wr + 2 * k + i), xv);
      a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(wr + 3 * k + i), xv);
    }
    y[r] = _mm512_reduce_add_ps(a0), y[r + 1] = _mm512_reduce_add_ps(a1);
    y[r + 2] = _mm512_reduce_add_ps(a2), y[r + 3] = _mm512_reduce_add_ps(a3);
  }
}

static void one_row(const uint16_t* w, const uint16_t* x, float* y, int64_t b, int64_t e, int64_t k) {
  const int64_t k128 = k - k % 128;
  for (int64_t r = b; r < e; ++r) {
    const uint16_t* wr = w + r * k;
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    int64_t i = 0;
    for (; i < k128; i += 128) {
      c0 = _mm512_dpbf16_ps(c0, (__m512bh)_mm512_loadu_si512(wr + i), (__m512bh)_mm512_loadu_si512(x + i));
      c1 = _mm512_dpbf16_ps(c1, (__m512bh)_mm512_loadu_si512(wr + i + 32), (__m512bh)_mm512_loadu_si512(x + i + 32));
      c2 = _mm512_dpbf16_ps(c2, (__m512bh)_mm512_loadu_si512(wr + i + 64), (__m512bh)_mm512_loadu_si512(x + i + 64));
      c3 = _mm512_dpbf16_ps(c3, (__m512bh)_mm512_loadu_si512(wr + i + 96), (__m512bh)_mm512_loadu_si512(x + i + 96));
    }
    for (; i < k; i += 32) c0 = _mm512_dpbf16_ps(c0, (__m512bh)_mm512_loadu_si512(wr + i), (__m512bh)_mm512_loadu_si512(x + i));
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)));
  }
}

int main(int argc, char** argv) {
  if (argc != 5) return fprintf(stderr, "usage: %s K N PATTERN(0|1) THP(0|1)\n", argv[0]), 2;
  const int64_t k = atoll(argv[1]), n = atoll(argv[2]);
  const int pattern = atoi(argv[3]), thp = atoi(argv[4]);
  if (k % 32 || n % 4) return fprintf(stderr, "K must be a multiple of 32, N of 4\n"), 2;
  const size_t bytes = (size_t)n * k * 2;
  int copies = (int)(2100000000LL / bytes);
  copies = copies < 4 ? 4 : (copies > 64 ? 64 : copies);
  uint16_t* all;
  if (posix_memalign((void**)&all, 2 << 20, bytes * copies)) return 1;
  if (thp) madvise(all, bytes * copies, MADV_HUGEPAGE);
  memset(all, 0x3f, bytes * copies);
  uint16_t* x = aligned_alloc(64, k * 2);
  for (int64_t i = 0; i < k; ++i) x[i] = 0x3f80;
  float* y = aligned_alloc(64, n * 4);
  const int passes = 40, warm = 4;
  double sum = 0, best = 1e9;
  for (int p = 0; p < passes; ++p) {
    const uint16_t* w = all + (size_t)(p % copies) * n * k;
    const double t0 = now();
#pragma omp parallel
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t per = ((n + nt - 1) / nt + 3) / 4 * 4, b = t * per, e = b + per < n ? b + per : n;
      if (pattern == 0) four_rows(w, x, y, b, e, k);
      else one_row(w, x, y, b, e, k);
    }
    const double d = now() - t0;
    if (p >= warm) sum += d, best = d < best ? d : best;
  }
  printf("k=%ld n=%ld pattern=%d thp=%d: %.1f GB/s mean, %.1f best\n", (long)k, (long)n, pattern, thp,
         bytes / (sum / (passes - warm)) / 1e9, bytes / best / 1e9);
  return 0;
}
