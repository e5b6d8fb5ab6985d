// MXFP4 blocks (ggml type 39: gpt-oss's experts, from a GGUF or re-packed from an HF checkpoint by
// loader/mxfp4_checkpoint.py): 17 bytes, an E8M0 exponent e then 16 bytes of E2M1 nibbles (value
// j in byte j's low nibble, value j + 16 in its high one). ggml's arithmetic, which
// kernels/ggml_quant.py's oracle repeats: value = kvalues_mxfp4[q] * 2^(e - 128), the E2M1 value
// doubled (so every one is an integer, -12..12) times the halved scale.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

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

// For vpdpbusd (unsigned weight bytes): a code enters as kvalue + 16 (4..28), the dot product
// starting from -16 * sum(x) (ggml_gemv.cpp's code offset, log2 16 = 4).
constexpr int kOffsetShift = 4;

// Blocks a, b as those unsigned codes in ggml_gemv.cpp's pair order [A values 0-15, B 0-15, A
// 16-31, B 16-31] (Q5_0's: two 16-byte loads, nibbles split), looked up by one vpshufb.
inline __m512i chunk(const uint8_t* a, const uint8_t* b) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i both =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 1))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1)), 1);
  const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(both, mask)),
                                       _mm256_and_si256(_mm256_srli_epi16(both, 4), mask), 1);
  const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4));
  return _mm512_shuffle_epi8(table, q);
}

// Block a's scale on the int32 lanes of its values in that order (0-3, 8-11), b's on 4-7, 12-15.
inline __m512 pair_scales(const uint8_t* a, const uint8_t* b) {
  return _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(e8m0_half(a[0])), _mm512_set1_ps(e8m0_half(b[0])));
}

}  // namespace tacit::mxfp4
