// Q4_0 / Q4_1 weights x 1-4 int8 activation rows, four blocks (128 weights) a step, AVX512-VNNI
// (MXFP4 reuses the activation layout and quantize_for_groups: ggml_mxfp4.h).
//
// The pairwise kernel in ggml_gemv.cpp (which Q5_0, Q8_0 and the K-quants still use) took ~25
// instructions per two blocks: each pair's nibbles from two 16-byte loads, each block's fp16 d (and
// m) read as a scalar and spread over its lanes, one conversion and two FMAs per 64 weights. Here
// a group of four blocks (80 bytes of Q4_1, 72 of Q4_0) is:
// - two 64-byte loads (the group's first and last 64 bytes) and one vpermt2w that puts block s's
//   16 code bytes in 128-bit lane s; the low nibbles are values 0-15 of each block, the high
//   nibbles values 16-31, same lanes;
// - one vpermw of the first load that picks every block's d (and Q4_1's m) four times over, so
//   int32 lane l gets block l/4's (the scales lie at words 0, 9, 18, 27 of Q4_0 and 0, 10, 20, 30
//   of Q4_1: all in the first 64 bytes);
// - per activation row: two vpdpbusd into the same int32 lanes (values 0-15 and 16-31 of a block
//   share its scale), one conversion, one product of the weight and activation scales, one FMA
//   (Q4_1: one more for m * the block's activation sum).
// One thread, weights in L2, one activation row: 1536 x 576 Q4_1 17-20 GB/s against the pairwise
// kernel's 14-16.
// The arithmetic is the pairwise kernel's (the same int8 rounding of the activations, exact
// integer dot products), summed in another order.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <vector>

#include "ggml_gemv.h"
#include "ggml_int8_activations.h"
#include "ggml_prefetch.h"

namespace tacit::q4_groups {

// T is kQ4_0 (fp16 d, 16 code bytes; d * (q - 8)) or kQ4_1 (d, m, codes;
// d * q + m); their block sizes are ggml_gemv.h's kBlockBytes.
template <int T>
constexpr int kCodesAt = T == kQ4_1 ? 4 : 2;

// Activation rows rounded to int8 per 32-value block (ggml_int8_activations.h), laid out
// for the groups: group g's 128 bytes hold block 4g+s's values 0-15 at 16s and 16-31 at 64 + 16s.
struct GroupRows {
  const int8_t* q;        // [M][groups][128]
  const float* scale;     // [M][groups][16]: int32 lane l -> dx of block 4g + l/4
  const float* sum;       // [M][groups][16]: dx * the sum of lane l's 8 int8 values (Q4_1's m term)
  const __m512i* start;   // [M][groups]: -8 * that sum (Q4_0's codes are q - 8: they enter as q;
                          // MXFP4's -16 * it: its codes enter as kvalue + 16, ggml_mxfp4.h)
  int64_t groups;
};

template <int T>
inline GroupRows quantize_for_groups(const uint16_t* x, int m, int64_t k) {
  const int64_t nb = k / 32, groups = (nb + 3) / 4;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scale, sum;
  thread_local std::vector<__m512i> start;
  q.assign(m * groups * 128, 0);  // a short last group's missing blocks stay 0
  scale.assign(m * groups * 16, 0.0f);
  sum.resize(m * groups * 16);
  start.resize(m * groups);
  for (int r = 0; r < m; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      __m512i lo, hi;
      const float dx = round_block_to_int8(x + r * k + b * 32, lo, hi);
      const int64_t g = r * groups + b / 4, s = b % 4;
      int8_t* dst = q.data() + g * 128 + 16 * s;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(lo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 64), _mm512_cvtsepi32_epi8(hi));
      for (int l = 0; l < 4; ++l) scale[g * 16 + 4 * s + l] = dx;
    }
    for (int64_t g = r * groups; g < (r + 1) * groups; ++g) {
      const __m512i ones = _mm512_set1_epi8(1);
      const __m512i lanes = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones,
                                                                    _mm512_loadu_si512(q.data() + g * 128)),
                                                ones, _mm512_loadu_si512(q.data() + g * 128 + 64));
      if constexpr (T == kQ4_1)
        _mm512_storeu_ps(sum.data() + g * 16, _mm512_mul_ps(_mm512_loadu_ps(scale.data() + g * 16), _mm512_cvtepi32_ps(lanes)));
      else
        start[g] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(lanes, T == kMXFP4 ? 4 : 3));
    }
  }
  return {q.data(), scale.data(), sum.data(), start.data(), groups};
}

// Word indices into a group's first 64 bytes (0-31) and its last 64 (32-63) that put block s's 16
// code bytes in 128-bit lane s.
template <int T>
inline __m512i code_words() {
  constexpr int bb = static_cast<int>(kBlockBytes<T>), last = (4 * bb - 64) / 2;
  alignas(64) static constexpr std::array<int16_t, 32> kIndex = [] {
    std::array<int16_t, 32> idx{};
    for (int w = 0; w < 32; ++w) {
      const int source = ((w / 8) * bb + kCodesAt<T>) / 2 + w % 8;
      idx[w] = static_cast<int16_t>(source < 32 ? source : 32 + source - last);
    }
    return idx;
  }();
  return _mm512_load_si512(kIndex.data());
}

// Row r of w against xq's M rows into y (rows of y n floats apart). One row at a time, one
// sequential stream a thread: 30 layers of the default model's Q4_1 shapes cycled from DRAM, two
// threads, streamed at 28-29 GB/s, and at 16-23 GB/s walking 4 rows side by side (as
// gemv_bf16.cpp found for bf16; in L2 the 4 rows were ~10% faster, a cost worth paying where
// decode reads from DRAM). Two accumulators alternating groups measured slower here.
template <int T, int M>
inline void group_row(const uint8_t* w, const GroupRows& xq, float* y, int64_t n, int64_t r, int64_t k) {
  constexpr int64_t bb = kBlockBytes<T>, gb = 4 * bb;
  const int64_t nb = k / 32, rb = nb * bb;
  // Per int32 lane l: the word of block l/4's d (lanes' words 0-15) and of its m (16-31).
  const __m512i scale_words =
      T == kQ4_1 ? _mm512_set_epi16(31, 31, 31, 31, 21, 21, 21, 21, 11, 11, 11, 11, 1, 1, 1, 1,  //
                                30, 30, 30, 30, 20, 20, 20, 20, 10, 10, 10, 10, 0, 0, 0, 0)
             : _mm512_set_epi16(27, 27, 27, 27, 18, 18, 18, 18, 9, 9, 9, 9, 0, 0, 0, 0,  //
                                27, 27, 27, 27, 18, 18, 18, 18, 9, 9, 9, 9, 0, 0, 0, 0);
  const __m512i codes_at = code_words<T>();
  const __m512i mask = _mm512_set1_epi8(0x0F);
  // A short last group (k not a multiple of 128) reads its blocks through masked loads, which
  // never touch the bytes past the row; the missing blocks read as zero scales and codes and add 0.
  const int64_t tail_bytes = nb % 4 * bb;
  const __mmask64 tail_first = tail_bytes >= 64 ? ~0ull : (1ull << tail_bytes) - 1;
  const __mmask64 tail_last = tail_bytes > gb - 64 ? (1ull << (tail_bytes - (gb - 64))) - 1 : 0;
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  const uint8_t* wr = w + r * rb;
  for (int64_t g = 0; g < xq.groups; ++g) {
    const bool whole = 4 * g + 4 <= nb;
    const __mmask64 first = whole ? ~0ull : tail_first, last = whole ? ~0ull : tail_last;
    const uint8_t* b = wr + g * gb;
    prefetch_ahead<2>(b);  // a group is 72-80 bytes: two lines cover wherever it starts
    const __m512i head = _mm512_maskz_loadu_epi8(first, b), end = _mm512_maskz_loadu_epi8(last, b + gb - 64);
    const __m512i codes = _mm512_permutex2var_epi16(head, codes_at, end);
    const __m512i lo = _mm512_and_si512(codes, mask), hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), mask);
    const __m512i words = _mm512_permutexvar_epi16(scale_words, head);
    const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(words));
    __m512 mn;
    if constexpr (T == kQ4_1) mn = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(words, 1));
    for (int m = 0; m < M; ++m) {
      const int64_t at = m * xq.groups + g;
      const __m512i begin = T == kQ4_1 ? _mm512_setzero_si512() : xq.start[at];
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(begin, lo, _mm512_loadu_si512(xq.q + at * 128)), hi,
                                              _mm512_loadu_si512(xq.q + at * 128 + 64));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_loadu_ps(xq.scale + at * 16)), acc[m]);
      if constexpr (T == kQ4_1) acc[m] = _mm512_fmadd_ps(mn, _mm512_loadu_ps(xq.sum + at * 16), acc[m]);
    }
  }
  for (int m = 0; m < M; ++m) y[m * n + r] = _mm512_reduce_add_ps(acc[m]);
}

// Rows [begin, end) of w x M activation rows, on the calling thread.
template <int T, int M>
void group_rows(const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end, int64_t k) {
  const GroupRows xq = quantize_for_groups<T>(x, M, k);
  for (int64_t r = begin; r < end; ++r) group_row<T, M>(w, xq, y, n, r, k);
}

}  // namespace tacit::q4_groups
