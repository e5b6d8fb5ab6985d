// bf16 activation rows rounded to int8 for the GGML int8 GEMVs, llama.cpp's q8_0 / q8_1 / q8_K
// arithmetic: scale dx = max|x| / 127 over a block (32 values: ggml_gemv.cpp's pairwise path and
// ggml_q4_groups.h; 256: ggml_k_quants.h), codes round-half-to-even(x * 127 / max|x|) in
// [-127, 127]. One implementation, so every path rounds the activations alike.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace tacit {

// max |x| over count (a multiple of 32) bf16 values.
inline float max_abs_bf16(const uint16_t* x, int64_t count) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < count; i += 16)
    m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)))));
  return _mm512_reduce_max_ps(m);
}

// The 32 values at xb times inv (127 / max|x| of their block, or 0), rounded half to even:
// values 0-15 into lo, 16-31 into hi (as int32 codes).
inline void round_to_int8(const uint16_t* xb, float inv, __m512i& lo, __m512i& hi) {
  const __m512 a = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)));
  const __m512 b = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16)));
  lo = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
  hi = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
}

// The 32-value block at xb rounded on its own scale: codes into lo, hi; its dx returned.
inline float round_block_to_int8(const uint16_t* xb, __m512i& lo, __m512i& hi) {
  const float amax = max_abs_bf16(xb, 32);
  round_to_int8(xb, amax > 0.0f ? 127.0f / amax : 0.0f, lo, hi);
  return amax / 127.0f;
}

}  // namespace tacit
