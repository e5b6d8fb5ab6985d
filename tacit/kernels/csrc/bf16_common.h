// Shared pieces of tacit's AVX512-BF16 CPU kernels: bf16 <-> fp32 with torch's rounding, an fp16
// field of a GGML block read as fp32, and the skinny GEMM that streams a bf16 weight once for 1-8
// activation rows.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace tacit {

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as c10::BFloat16 does: every bf16 op in eager torch computes in fp32
// and rounds its result this way, so a fused kernel that rounds at the same points reproduces
// torch's numbers rather than merely approximating them.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// The fp16 value at p (a GGML block's scale), unaligned.
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

constexpr int kMaxSkinnyRows = 8;  // keep in step with _KERNEL_ROWS in layers/linear.py

// y[m, n] (fp32) = x[m, k] @ w[n, k]^T for 1 <= m <= kMaxSkinnyRows, bf16 inputs, threads split
// the rows of w.
void gemv_bf16(const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t k, int m);
// The same for rows [begin, end) of w on the calling thread alone (y[m, n] as above), for callers
// that split work across threads themselves (csrc/fused_moe.cpp).
void gemv_bf16_rows(const uint16_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end, int64_t k,
                    int m);

}  // namespace tacit
