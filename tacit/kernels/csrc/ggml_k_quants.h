// Q4_K / Q5_K / Q6_K weights x 1-8 int8 activation rows, one 256-value super-block a step,
// AVX512-BW/VNNI, llama.cpp's q8_K arithmetic.
//
// The pairwise int8 kernel (ggml_gemv.cpp) rounded the activations per 32 values, so every 64
// weights paid a float conversion, a scale product and an FMA per activation row, and each
// super-block's 6-bit scales were turned into floats: Q4_K ran at 18 GB/s a core (one thread,
// weights in L2; Q8_0 36), under the two-thread read bandwidth, and random:llama-1b's Q4_K_M file
// decoded at 0.93-0.96x llama.cpp. 512 x 2048, one thread, one row (`python
// scripts/ggml_gemv_speed.py --n 512 --threads 1 --rows 1,4,8 Q4_K Q5_K Q6_K`, two runs): Q4_K
// 0.037-0.039 -> 0.028-0.029 ms a call, Q5_K 0.049-0.050 -> 0.035-0.036, Q6_K 0.042 -> 0.033; at
// 8 rows, one pass here against two passes of 4 before, about the same. Here, as llama.cpp's q8_K, an activation row is rounded to
// int8 with one scale per 256 values (max|x| / 127 over the super-block), so a super-block's dot
// product stays in integers until its end:
// - vpmaddubsw multiplies 64 weight codes (unsigned, < 64) by 64 int8 activations into 32 int16
//   pair sums (at most 2 * 63 * 127 = 16002: no saturation), and vpdpwssd multiplies those by the
//   codes' integer scale (Q4_K/Q5_K's 6-bit sc per 32 values, Q6_K's int8 per 16) and adds them
//   into int32 lanes (at most 127 * 63 * 127 * 256 = 2.6e8 per super-block);
// - one conversion and one FMA per super-block and activation row apply d * dx;
// - the offset term (Q4_K/Q5_K: dmin * m per 32 values; Q6_K: the codes' -32 times d * sc per 16)
//   is one vpmaddwd of the group scales with the activations' int16 sums per 16 values.
// The error this adds against the fp32 oracle is the activations' rounding, at most
// max|x_super-block| / 254 per value.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <vector>

#include "bf16_common.h"
#include "ggml_gemv.h"
#include "ggml_int8_activations.h"
#include "ggml_prefetch.h"

namespace tacit::k_quants {

// Where the activations' 32-value pieces lie in a super-block's four 64-byte vectors: vector v holds
// pieces kPieceAt[2v] (bytes 0-31) and kPieceAt[2v + 1] (32-63). Q4_K/Q5_K keep each 64 values'
// codes as 32 bytes (low nibbles pieces 2c, high 2c + 1), so one 64-byte load of chunks c and c + 1
// splits into pieces [2c, 2c + 2] (low nibbles) and [2c + 1, 2c + 3] (high): the activations follow.
// Q6_K's 64-byte loads unpack in natural order. Both orders are their own inverse, so the same
// table also gives a piece's place (quantize_super_rows reads it that way).
template <int T>
constexpr std::array<int, 8> kPieceAt = T == kQ6_K ? std::array<int, 8>{0, 1, 2, 3, 4, 5, 6, 7}
                                                  : std::array<int, 8>{0, 2, 1, 3, 4, 6, 5, 7};

// Activation rows rounded to int8 per super-block.
struct SuperRows {
  const int8_t* q;       // [M][supers][256], pieces in kPieceAt order
  const float* scale;    // [M][supers]: dx
  const int16_t* sum16;  // [M][supers][16]: the sum of each 16 int8 values, natural order
  int64_t supers;
};

template <int T>
inline SuperRows quantize_super_rows(const uint16_t* x, int m, int64_t k) {
  const int64_t supers = k / 256;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<int16_t> sum16;
  q.resize(m * supers * 256);
  scale.resize(m * supers);
  sum16.resize(m * supers * 16);
  for (int64_t s = 0; s < m * supers; ++s) {
    const uint16_t* xs = x + s * 256;  // row r's super-blocks follow row r - 1's: k = 256 * supers
    const float amax = max_abs_bf16(xs, 256);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[s] = amax / 127.0f;
    for (int p = 0; p < 8; ++p) {
      __m512i lo, hi;
      round_to_int8(xs + 32 * p, inv, lo, hi);
      int8_t* dst = q.data() + s * 256 + 32 * kPieceAt<T>[p];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(lo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtsepi32_epi8(hi));
      sum16[s * 16 + 2 * p] = static_cast<int16_t>(_mm512_reduce_add_epi32(lo));
      sum16[s * 16 + 2 * p + 1] = static_cast<int16_t>(_mm512_reduce_add_epi32(hi));
    }
  }
  return {q.data(), scale.data(), sum16.data(), supers};
}

// One super-block unpacked: four vectors of 64 codes (in kPieceAt order), the int16 scale of each
// code pair per vector, the 16 group scales of the offset term (one per 16 values, natural order),
// and the float factors of the two terms.
struct Super {
  __m512i codes[4], scales[4];
  __m256i group_scales;
  float d, offset_d;  // result = d * dot - offset_d * (group_scales . sum16)
};

// vpermw indices for Q6_K: int16 lane j of vector v (the pair sum of its values 2j, 2j + 1) takes
// the scale of its 16-value group, 4v + j / 8.
inline __m512i q6_k_scale_words(int v) {
  alignas(64) static const std::array<std::array<int16_t, 32>, 4> kIndex = [] {
    std::array<std::array<int16_t, 32>, 4> idx{};
    for (int vec = 0; vec < 4; ++vec)
      for (int j = 0; j < 32; ++j) idx[vec][j] = static_cast<int16_t>(4 * vec + j / 8);
    return idx;
  }();
  return _mm512_load_si512(kIndex[v].data());
}

// vpshufb controls for Q4_K/Q5_K: int16 lane j of vector v = the 6-bit scale byte of its 32-value
// piece (bytes 0-7 of each 128-bit lane), high byte zero (control -1).
template <int T>
inline __m512i scale_bytes(int v) {
  alignas(64) static const std::array<std::array<int8_t, 64>, 4> kControl = [] {
    std::array<std::array<int8_t, 64>, 4> c{};
    for (int vec = 0; vec < 4; ++vec)
      for (int j = 0; j < 32; ++j) {
        c[vec][2 * j] = static_cast<int8_t>(kPieceAt<T>[2 * vec + j / 16]);
        c[vec][2 * j + 1] = -1;
      }
    return c;
  }();
  return _mm512_load_si512(kControl[v].data());
}

template <int T>
inline void unpack(const uint8_t* b, Super& u) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  if constexpr (T == kQ6_K) {
    // ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, fp16 d at 208. Half h's 64 ql bytes hold
    // values 128h + 0-63 in their low nibbles, + 64-127 in their high ones; its 32 qh bytes the top
    // two bits: bits 0-1 values 0-31, 2-3 32-63, 4-5 64-95, 6-7 96-127.
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      const __m512i top = _mm512_set1_epi8(0x30);
      u.codes[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, nibble), _mm512_and_si512(_mm512_slli_epi16(qh2, 4), top));
      u.codes[2 * h + 1] =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nibble), _mm512_and_si512(qh2, top));
    }
    u.group_scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    for (int v = 0; v < 4; ++v)
      u.scales[v] = _mm512_permutexvar_epi16(q6_k_scale_words(v), _mm512_castsi256_si512(u.group_scales));
    u.d = half_at(b + 208);
    u.offset_d = 32.0f * u.d;
  } else {
    // fp16 d, dmin at 0, 2; 12 bytes of 6-bit scales and mins at 4 (ggml's get_scale_min_k4:
    // pieces 0-3 the low 6 bits of bytes 0-3 (sc) and 4-7 (m); 4-7 their low 4 bits from bytes
    // 8-11 (sc: low nibble, m: high), their top 2 from bits 6-7 of bytes 0-3 (sc) and 4-7 (m));
    // Q5_K's 32 qh bytes at 16 (bit p of byte i: + 16 on value i of piece p); 128 code bytes after.
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));  // dwords a, m, h, (codes)
    const __m128i low6 = _mm_and_si128(v, _mm_set1_epi8(0x3F));                    // sc 0-3, m 0-3
    const __m128i top2 = _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30));  // a, m bits 6-7 at 4-5
    const __m128i h = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0xAA), _mm_set_epi32(0, 0, 4, 0));
    const __m128i high = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi8(0x0F)), top2);  // sc 4-7, m 4-7
    const __m128i bytes = _mm_unpacklo_epi32(low6, high);                            // sc 0-7, m 0-7
    // Each 128-bit lane of the broadcast: its bytes as int16 words by vpshufb (control -1 writes 0).
    const __m512i all = _mm512_broadcast_i32x4(bytes);
    for (int v = 0; v < 4; ++v) u.scales[v] = _mm512_shuffle_epi8(all, scale_bytes<T>(v));
    u.group_scales = _mm256_shuffle_epi8(_mm512_castsi512_si256(all), _mm256_set_epi8(
        -1, 15, -1, 15, -1, 14, -1, 14, -1, 13, -1, 13, -1, 12, -1, 12,
        -1, 11, -1, 11, -1, 10, -1, 10, -1, 9, -1, 9, -1, 8, -1, 8));
    u.d = half_at(b);
    u.offset_d = half_at(b + 2);
    constexpr int qs = T == kQ5_K ? 48 : 16;
    for (int half = 0; half < 2; ++half) {
      const __m512i v = _mm512_loadu_si512(b + qs + 64 * half);
      u.codes[2 * half] = _mm512_and_si512(v, nibble);
      u.codes[2 * half + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
    }
    if constexpr (T == kQ5_K) {
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
      for (int v = 0; v < 4; ++v) {
        const int p0 = kPieceAt<T>[2 * v], p1 = kPieceAt<T>[2 * v + 1];
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << p0)),
                                               _mm256_set1_epi8(static_cast<char>(1 << p1)), 1);
        u.codes[v] = _mm512_mask_add_epi8(u.codes[v], _mm512_test_epi8_mask(qh, bit), u.codes[v], _mm512_set1_epi8(16));
      }
    }
  }
}

// Row r of w against xq's M rows into y (rows of y n floats apart); one weight row at a time, one
// sequential stream a thread (as ggml_q4_groups.h).
template <int T, int M>
inline void super_row(const uint8_t* w, const SuperRows& xq, float* y, int64_t n, int64_t r) {
  __m512 acc[M];
  __m512 offset[M];  // lanes 0-7 used
  for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps(), offset[i] = _mm512_setzero_ps();
  const uint8_t* wr = w + r * xq.supers * kBlockBytes<T>;
  for (int64_t s = 0; s < xq.supers; ++s) {
    Super u;
    const uint8_t* block = wr + s * kBlockBytes<T>;
    prefetch_ahead<(kBlockBytes<T> + 63) / 64>(block);
    unpack<T>(block, u);
    for (int i = 0; i < M; ++i) {
      const int64_t at = i * xq.supers + s;
      const int8_t* xs = xq.q + at * 256;
      __m512i dot = _mm512_setzero_si512();
      for (int v = 0; v < 4; ++v)
        dot = _mm512_dpwssd_epi32(dot, _mm512_maddubs_epi16(u.codes[v], _mm512_loadu_si512(xs + 64 * v)), u.scales[v]);
      const float dx = xq.scale[at];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(u.d * dx), acc[i]);
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.sum16 + at * 16));
      const __m512i terms = _mm512_zextsi256_si512(_mm256_madd_epi16(u.group_scales, sums));
      offset[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(terms), _mm512_set1_ps(u.offset_d * dx), offset[i]);
    }
  }
  // The min / offset term folded in before the one reduction a row.
  for (int i = 0; i < M; ++i) y[i * n + r] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[i], offset[i]));
}

// Rows [begin, end) of w x M activation rows (k a multiple of 256), on the calling thread.
template <int T, int M>
void super_rows(const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end, int64_t k) {
  const SuperRows xq = quantize_super_rows<T>(x, M, k);
  for (int64_t r = begin; r < end; ++r) super_row<T, M>(w, xq, y, n, r);
}

}  // namespace tacit::k_quants
