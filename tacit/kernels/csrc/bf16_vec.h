// 16-lane fp32 helpers over bf16 data shared by the fused decode step's kernels: load and
// store with torch's rounding, and exp.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "bf16_common.h"

namespace tacit {

inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

inline void store16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
}

inline __m512 round16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

// exp for 16 floats (Cephes' polynomial, ~1 ulp): silu and softmax need it per element, and
// scalar expf over SmolLM2's 1,536-wide MLP costs ~0.3 ms a step.
inline __m512 exp16(__m512 x) {
  // Constant first: vmaxps/vminps return their second operand when one is NaN, so a NaN
  // passes through (as in torch) instead of being clamped to a finite value.
  x = _mm512_min_ps(_mm512_set1_ps(88.37f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
  __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, fx);
}

inline float exp1(float x) {
  alignas(64) float buf[16] = {x};
  _mm512_store_ps(buf, exp16(_mm512_load_ps(buf)));
  return buf[0];
}

// act = round(round(silu(round(gate))) * round(up)) from fp32 GEMV outputs: each op rounded to
// bf16 where torch's bf16 ops round (SwiGLU of the dense MLP and of every MoE expert).
inline void silu_mul(const float* gate, const float* up, uint16_t* act, int64_t n) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = round16(_mm512_loadu_ps(gate + i));
    const __m512 s = round16(_mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
    store16(act + i, _mm512_mul_ps(s, round16(_mm512_loadu_ps(up + i))));
  }
  for (; i < n; ++i) {
    const float g = round_bf16(gate[i]);
    act[i] = float_to_bf16(round_bf16(g / (1.0f + exp1(-g))) * round_bf16(up[i]));
  }
}

}  // namespace tacit
