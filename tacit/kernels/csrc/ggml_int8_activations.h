// One 32-value block of a bf16 activation row rounded to int8 for the GGML int8 GEMVs
// (ggml_gemv.cpp's pairwise and K-quant paths, ggml_q4_groups.h's four-block path), llama.cpp's
// q8_0 / q8_1 arithmetic: scale dx = max|x| / 127, codes round-half-to-even(x / dx) in
// [-127, 127]. One implementation, so every path rounds the activations alike.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace tacit {

// The block at xb (32 bf16 values): values 0-15 into lo, 16-31 into hi (as int32 codes), its dx returned.
inline float round_block_to_int8(const uint16_t* xb, __m512i& lo, __m512i& hi) {
  const __m512 a = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)));
  const __m512 b = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16)));
  const float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(a)), _mm512_reduce_max_ps(_mm512_abs_ps(b)));
  const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  lo = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));  // round half to even
  hi = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  return amax / 127.0f;
}

}  // namespace tacit
