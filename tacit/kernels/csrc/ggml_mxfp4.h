// MXFP4 blocks (ggml type 39: gpt-oss's experts, from a GGUF or re-packed from an HF checkpoint by
// loader/mxfp4_checkpoint.py): 17 bytes, an E8M0 exponent e then 16 bytes of E2M1 nibbles (value
// j in byte j's low nibble, value j + 16 in its high one). ggml's arithmetic, which
// kernels/ggml_quant.py's oracle repeats: value = kvalues_mxfp4[q] * 2^(e - 128), the E2M1 value
// doubled (so every one is an integer, -12..12) times the halved scale.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ggml_gemv.h"
#include "ggml_prefetch.h"
#include "ggml_q4_groups.h"

namespace tacit::mxfp4 {

// ggml's GGML_E8M0_TO_FP32_HALF bit for bit: 2^(e - 128); e = 0, 1 are the subnormals 2^-128,
// 2^-127, the rest the normal float whose exponent field is e - 1.
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// kvalues_mxfp4, indexed by the nibble.
alignas(64) inline constexpr float kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// One block's 32 values as bf16, value i in lane i. Exact: a value is at most 2 significant bits
// (12 = 3 * 4) times a power of two, so the fp32 product and its bf16 rounding are the oracle's
// value (below 2^-126, bf16's normal range, the conversion flushes it to zero: scales e <= 3).
inline __m512bh dequant_block(const uint8_t* b) {
  const __m512 d = _mm512_set1_ps(e8m0_half(b[0]));
  const __m512 table = _mm512_load_ps(kValues);
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1)));
  const __m512 lo = _mm512_permutexvar_ps(_mm512_and_si512(q, _mm512_set1_epi32(0xF)), table);
  const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  return _mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, d), _mm512_mul_ps(lo, d));
}

// ---- 1-4 int8 activation rows: four blocks (128 weights) a step, ggml_q4_groups.h's layout ----
//
// vpdpbusd multiplies unsigned weight bytes, so a code enters as kvalue + 16 (4..28), looked up
// by one vpshufb per 64 nibbles, and the dot product starts from -16 * sum(x) (GroupRows.start).
// A group of four 17-byte blocks: their 16 code bytes by four 16-byte loads into 128-bit lanes
// 0-3 (the blocks start at odd offsets, so Q4_0's word permute cannot gather them), their
// exponents turned into 2^(e - 128) four at a time. The arithmetic is exact up to fp32 sums: each
// int32 lane sums 8 products |kvalue * x| <= 12 * 127, and d * dx is a power of two times dx.
// 2880 x 2880 (gpt-oss's hidden size), one thread, weights in cache, a shared 2-core machine: 0.28
// ms at one row, 0.53 at four, Q4_0's four-block kernel 0.27 / 0.54 in the same run.

// Int32 lane l (of 16): block l / 4's 2^(e - 128), e the exponent bytes of a group's blocks.
inline __m512 group_scales(const uint8_t* b) {
  const __m128i e = _mm_setr_epi32(b[0], b[17], b[34], b[51]);
  const __m128i normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
  const __m128i subnormal = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
  const __m128i bits = _mm_mask_blend_epi32(_mm_cmplt_epi32_mask(e, _mm_set1_epi32(2)), normal, subnormal);
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_castsi128_ps(bits)));
}

// Row r of w (MXFP4) against xq's M rows into y (rows of y n floats apart).
template <int M>
inline void group_row(const uint8_t* w, const q4_groups::GroupRows& xq, float* y, int64_t n, int64_t r, int64_t k) {
  constexpr int64_t bb = 17, gb = 4 * bb;
  const int64_t nb = k / 32, rb = nb * bb;
  const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4));
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  const uint8_t* wr = w + r * rb;
  alignas(64) uint8_t tail[gb] = {};  // a short last group: its blocks, then zeros (never past the row)
  for (int64_t g = 0; g < xq.groups; ++g) {
    const uint8_t* b = wr + g * gb;
    if (4 * g + 4 > nb) {
      std::memcpy(tail, b, (nb - 4 * g) * bb);
      b = tail;
    }
    prefetch_ahead<2>(b);  // 68 bytes: two lines cover wherever the group starts
    const auto codes_of = [&](int s) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + s * bb + 1)); };
    const __m512i codes = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(codes_of(0)), codes_of(1), 1), codes_of(2), 2),
        codes_of(3), 3);
    const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(codes, mask));
    const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(codes, 4), mask));
    const __m512 d = group_scales(b);
    for (int m = 0; m < M; ++m) {
      const int64_t at = m * xq.groups + g;
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xq.start[at], lo, _mm512_loadu_si512(xq.q + at * 128)),
                                              hi, _mm512_loadu_si512(xq.q + at * 128 + 64));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_loadu_ps(xq.scale + at * 16)), acc[m]);
    }
  }
  for (int m = 0; m < M; ++m) y[m * n + r] = _mm512_reduce_add_ps(acc[m]);
}

// Rows [begin, end) of w x M activation rows, on the calling thread.
template <int M>
void group_rows(const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end, int64_t k) {
  const q4_groups::GroupRows xq = q4_groups::quantize_for_groups<kMXFP4>(x, M, k);
  for (int64_t r = begin; r < end; ++r) group_row<M>(w, xq, y, n, r, k);
}

}  // namespace tacit::mxfp4
