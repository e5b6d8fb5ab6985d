// Pieces the bf16 and int8 decode attention kernels share: prefetching K/V rows, tail masks,
// and the 16-keys-at-once horizontal reduction of their score tiles.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

namespace tacit {

constexpr int kTile = 16;  // keys scored per transpose-reduce
// K/V rows are prefetched this many keys ahead, into L2: ~5% faster than 16 keys into L1 on
// the bf16 step (L2's queue keeps more misses in flight); 64 keys ahead was slower.
constexpr int kPrefetchKeys = 32;

inline void prefetch_row(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + b, _MM_HINT_T1);
}

// f(std::integral_constant<int, 0>{}), ..., f(<N - 1>): a loop unrolled in the source. Arrays of
// accumulators indexed by a `#pragma GCC unroll` loop's counter stay in memory (GCC 12 splits
// arrays into registers before it unrolls loops): a store, or a copy in and out, per vpdpbusd.
template <int N, class F>
__attribute__((always_inline)) inline void unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

inline __mmask32 low_bits32(int64_t n) { return n >= 32 ? 0xffffffffu : (1u << n) - 1u; }
inline __mmask64 low_bits64(int64_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1ull; }
inline __mmask16 low_bits16(int64_t n) { return n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1u); }

// The largest of s[0..n), NaN if any is: a NaN score makes the whole softmax row NaN, as torch's.
inline float max_or_nan(const float* s, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = low_bits16(n - j);
    const __m512 v = _mm512_mask_loadu_ps(vmax, m, s + j);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, v);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(vmax);
}

// How the decode kernels deal (row, kv head) pairs to threads. With fewer pairs than threads
// (MLA's single kv head at batch 1), each pair's `group` query heads go out in `splits` slices
// of `slice` heads that read the same K/V rows, rather than leave a core idle: MLA at 4k
// context, 16 heads, one row: 0.55-0.61 ms on two threads against 1.04-1.26 on one (bf16; it
// is compute-bound: one thread streams the 4.7 MB of latents at ~4 GB/s). Item i is pair
// i / splits, heads [i % splits * slice, + slice) of it (none past group).
struct HeadSlices {
  int64_t splits, slice, items;
  int threads;
  HeadSlices(int64_t pairs, int64_t group, int64_t avail) {
    splits = pairs < avail ? std::min<int64_t>(group, (avail + pairs - 1) / pairs) : 1;
    slice = (group + splits - 1) / splits;
    items = pairs * splits;
    threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(avail, items)));
  }
};

// reduce16x16 over int32 lanes (the int8 kernel's dot products): integer adds, one conversion
// at the end instead of 16.
inline __m512 reduce16x16_epi32(const __m512i a[16]) {
  __m512i v[8], w[4];
  for (int i = 0; i < 8; ++i)
    v[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0x44),
                            _mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    w[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0x88),
                            _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0xDD));
  const __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi32(w[0], w[1]), _mm512_unpackhi_epi32(w[0], w[1]));
  const __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi32(w[2], w[3]), _mm512_unpackhi_epi32(w[2], w[3]));
  const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
  return _mm512_cvtepi32_ps(
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s));
}

// Result lane i = the sum of a[i]'s 16 lanes. Halves, then quarters, then in-lane pairs, so
// 16 keys cost 15 adds and ~30 shuffles instead of 16 reductions of 8 dependent ops each.
inline __m512 reduce16x16(const __m512 a[16]) {
  __m512 v[8], w[4];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: lanes 0-7 hold a[2i]'s partial sums, 8-15 a[2i+1]'s
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lane L of w[i] holds key 4i+L's 4 partial sums
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  const __m512 u0 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
  const __m512 u1 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
  const __m512d u0d = _mm512_castps_pd(u0), u1d = _mm512_castps_pd(u1);
  const __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(u0d, u1d)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(u0d, u1d)));
  // Lane 4L+m now holds key L+4m.
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}

}  // namespace tacit
