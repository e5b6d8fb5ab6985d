// GGML block-quantized weight x (1..8 rows of bf16 activations) for decode, AVX512-BF16.
//
// Decode is memory-bound: a Q4_1 weight streams at 20 bytes per 32 values against bf16's 64,
// so the kernel's job is to turn each block into bf16 in registers fast enough to keep up.
// Each block is dequantized in fp32 (d * q + m, the gguf package's arithmetic), rounded to
// bf16 (the same bf16 weight a dequantized model holds) and fed to vdpbf16ps: R weight rows x
// M activation rows per pass, so each dequantized block feeds M dot products and each
// activation load feeds R. (gemv_bf16.cpp reads one bf16 row at a time instead: with no
// unpacking to share, a single sequential stream is what keeps its bandwidth up. Here one row
// at a time measured no faster: the unpacking, not the access pattern, bounds these types.)
// Error against the fp32 oracle (dequantize, matmul): the weight's bf16 rounding, |dw| <=
// 2^-9 |w|, plus fp32 summation and the output's bf16 rounding. That is the path at 5-8 rows
// (Q4_0/Q4_1/Q5_0/Q8_0/MXFP4), for FP8, and with int8 activations off; 1-4 rows of the GGML types (and
// 5-8 of the K-quants) take int8 dot products instead (Q5_0 / Q8_0 further down, Q4_0 / Q4_1 in
// ggml_q4_groups.h, the K-quants in ggml_k_quants.h).
#include "ggml_gemv.h"

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "bf16_common.h"
#include "ggml_int8_activations.h"
#include "ggml_k_quants.h"
#include "ggml_mxfp4.h"
#include "ggml_prefetch.h"
#include "ggml_q4_groups.h"

namespace tacit {

namespace {
thread_local bool t_int8_activations = true;  // the calling thread's choice (ggml_gemv.h)
}  // namespace

bool ggml_int8_activations() { return t_int8_activations; }
GgmlActivations::GgmlActivations(bool int8) : saved_(t_int8_activations) { t_int8_activations = int8; }
GgmlActivations::~GgmlActivations() { t_int8_activations = saved_; }

namespace {

inline float float_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// 32 e4m3fn bytes -> their exact values as bf16, unscaled (every e4m3 value is a bf16 value: 3
// mantissa bits, exponents 2^-9..2^8). Normals: the exponent rebiased from 7 to 127 by adding 120;
// subnormals m * 2^-9 (m = 1..7) are bf16 normals, read from a table indexed by m.
inline __m512bh e4m3_to_bf16(const uint8_t* p) {
  alignas(64) static const uint16_t kSubnormals[32] = {0, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60};
  const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi16(0x7F));
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8);
  const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
  const __m512i subnormal = _mm512_permutexvar_epi16(mag, _mm512_load_si512(kSubnormals));
  const __m512i v = _mm512_mask_blend_epi16(_mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), normal, subnormal);
  return (__m512bh)_mm512_or_si512(v, sign);
}

// One block's 32 values as bf16, value i in lane i (low nibbles are values 0-15, high 16-31).
template <int T>
inline __m512bh dequant_block(const uint8_t* b) {
  if constexpr (T == kMXFP4) {
    return mxfp4::dequant_block(b);
  } else if constexpr (T == kQ8_0) {
    const __m512 d = _mm512_set1_ps(half_at(b));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2))));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18))));
    return _mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, d), _mm512_mul_ps(lo, d));
  } else if constexpr (T == kF8E4M3) {
    // value * block scale in fp32, then one bf16 rounding: DeepSeek's weight_dequant arithmetic.
    const __m512 d = _mm512_set1_ps(float_at(b));
    const __m512i v = (__m512i)e4m3_to_bf16(b + 4);
    const __m512 lo = _mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256(v));
    const __m512 hi = _mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64(v, 1));
    return _mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, d), _mm512_mul_ps(lo, d));
  } else if constexpr (T == kQ5_0) {
    // q = nibble + 16 * (bit j of the block's 32-bit qh) for value j; value = d * (q - 16)
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m512 d = _mm512_set1_ps(half_at(b));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6)));
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i bits_lo = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(qh & 0xFFFF), lanes), one);
    const __m512i bits_hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(qh >> 16), lanes), one);
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, _mm512_set1_epi32(0xF)), _mm512_slli_epi32(bits_lo, 4));
    const __m512i hi = _mm512_or_si512(_mm512_srli_epi32(q, 4), _mm512_slli_epi32(bits_hi, 4));
    const __m512 sixteen = _mm512_set1_ps(16.0f);
    return _mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(hi), sixteen), d),
                               _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(lo), sixteen), d));
  } else {
    constexpr int qs = T == kQ4_1 ? 4 : 2;
    const __m512 d = _mm512_set1_ps(half_at(b));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + qs)));
    __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0xF)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4));
    if constexpr (T == kQ4_1) {
      const __m512 m = _mm512_set1_ps(half_at(b + 2));
      lo = _mm512_fmadd_ps(lo, d, m);
      hi = _mm512_fmadd_ps(hi, d, m);
    } else {
      const __m512 eight = _mm512_set1_ps(8.0f);
      lo = _mm512_mul_ps(_mm512_sub_ps(lo, eight), d);
      hi = _mm512_mul_ps(_mm512_sub_ps(hi, eight), d);
    }
    return _mm512_cvtne2ps_pbh(hi, lo);
  }
}


// Q4_K (Q5_K) sub-block s (0-7) of the block at b: (d * sc) * q - dmin * m, the gguf package's
// order; sc and m are 6-bit fields packed in the block's 12 scale bytes (ggml's
// get_scale_min_k4). Q5_K adds 16 where bit s of byte l of its 32 qh bytes is set.
template <bool kFifthBit>
inline __m512bh dequant_q4_k(const uint8_t* b, int s) {
  const uint8_t* q = b + 4;
  int sc, mn;
  if (s < 4) {
    sc = q[s] & 63;
    mn = q[s + 4] & 63;
  } else {
    sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
    mn = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
  const __m512 scale = _mm512_set1_ps(half_at(b) * static_cast<float>(sc));
  const __m512 minv = _mm512_set1_ps(half_at(b + 2) * static_cast<float>(mn));
  const uint8_t* qs = b + (kFifthBit ? 48 : 16) + (s >> 1) * 32;
  __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)));
  if (s & 1) {
    lo = _mm512_srli_epi32(lo, 4);
    hi = _mm512_srli_epi32(hi, 4);
  } else {
    lo = _mm512_and_si512(lo, _mm512_set1_epi32(0xF));
    hi = _mm512_and_si512(hi, _mm512_set1_epi32(0xF));
  }
  if constexpr (kFifthBit) {
    const __m128i shift = _mm_cvtsi32_si128(s);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i h0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
    const __m512i h1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32)));
    lo = _mm512_or_si512(lo, _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(h0, shift), one), 4));
    hi = _mm512_or_si512(hi, _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(h1, shift), one), 4));
  }
  const __m512 vlo = _mm512_fmsub_ps(_mm512_cvtepi32_ps(lo), scale, minv);
  const __m512 vhi = _mm512_fmsub_ps(_mm512_cvtepi32_ps(hi), scale, minv);
  return _mm512_cvtne2ps_pbh(vhi, vlo);
}

// Q6_K 32-value piece s (0-7) of the block at b: (d * sc) * (q - 32), the gguf package's order,
// with one int8 scale per 16 values. Piece s: half h = s / 4, j = s % 4; its low 4 bits are
// the low (j < 2) or high nibbles of ql[64h + 32(j % 2) ..], its top 2 bits qh[32h ..] >> 2j.
inline __m512bh dequant_q6_k(const uint8_t* b, int s) {
  const int h = s >> 2, j = s & 3;
  const uint8_t* ql = b + h * 64 + (j & 1) * 32;
  const uint8_t* qh = b + 128 + h * 32;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + s * 2;
  const float d = half_at(b + 208);
  const __m128i shift_lo = _mm_cvtsi32_si128(j >= 2 ? 4 : 0), shift_hi = _mm_cvtsi32_si128(2 * j);
  const __m512i mask4 = _mm512_set1_epi32(0xF), mask2 = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
  __m512 v[2];
  for (int half = 0; half < 2; ++half) {
    __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * half)));
    __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * half)));
    lo = _mm512_and_si512(_mm512_srl_epi32(lo, shift_lo), mask4);
    hi = _mm512_and_si512(_mm512_srl_epi32(hi, shift_hi), mask2);
    const __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), bias);
    v[half] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(d * static_cast<float>(sc[half])));
  }
  return _mm512_cvtne2ps_pbh(v[1], v[0]);
}

// The 32 values from index 32 * i of a row, as bf16.
template <int T>
inline __m512bh dequant_32(const uint8_t* row, int64_t i) {
  if constexpr (T == kQ4_K || T == kQ5_K)
    return dequant_q4_k<T == kQ5_K>(row + (i >> 3) * kBlockBytes<T>, static_cast<int>(i & 7));
  else if constexpr (T == kQ6_K)
    return dequant_q6_k(row + (i >> 3) * kBlockBytes<T>, static_cast<int>(i & 7));
  else
    return dequant_block<T>(row + i * kBlockBytes<T>);
}

template <int T, int R, int M>
inline void tile_kernel(const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t r, int64_t k) {
  constexpr int64_t bb = kBlockBytes<T> * 32 / kBlockValues<T>;  // bytes per 32 values
  const int64_t nb = k / 32, rb = k / kBlockValues<T> * kBlockBytes<T>;
  __m512 acc[R][M];
  for (int j = 0; j < R; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  const uint8_t* wr = w + r * rb;
  for (int64_t b = 0; b < nb; ++b) {
    // One prefetch per 64-byte line, 8 rows ahead, to overlap DRAM latency.
    if ((b * bb) % 64 < bb)
      for (int j = 0; j < R; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr + (8 + j) * rb + b * bb), _MM_HINT_T0);
    __m512bh wv[R];
    if constexpr (T == kF8E4M3) {
      // The e4m3 values are exact in bf16, so the dot product runs on them unscaled and the
      // block's scale multiplies its fp32 partial sum: one FMA per weight row and activation row
      // instead of scaling and rounding 32 weights (2 fp32 multiplies and a bf16 conversion,
      // after a 16-lane fp32 decode). 4096 x 4096, one row, one thread: 0.48 ms where that took
      // 1.00 ms (Q8_0: 0.46). No rounding of the scaled weight either: closer to the fp32 oracle.
      __m512 sv[R];
      for (int j = 0; j < R; ++j) {
        const uint8_t* block = wr + j * rb + b * bb;
        sv[j] = _mm512_set1_ps(float_at(block));
        wv[j] = e4m3_to_bf16(block + 4);
      }
      for (int m = 0; m < M; ++m) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * k + b * 32);
        for (int j = 0; j < R; ++j)
          acc[j][m] = _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), wv[j], xv), sv[j], acc[j][m]);
      }
      continue;
    }
    for (int j = 0; j < R; ++j) wv[j] = dequant_32<T>(wr + j * rb, b);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * k + b * 32);
      for (int j = 0; j < R; ++j) acc[j][m] = _mm512_dpbf16_ps(acc[j][m], wv[j], xv);
    }
  }
  for (int j = 0; j < R; ++j)
    for (int m = 0; m < M; ++m) y[m * n + r + j] = _mm512_reduce_add_ps(acc[j][m]);
}

// ---- Int8 dot products (vpdpbusd), as llama.cpp multiplies quantized weights ----
//
// Unpacking a 4-bit block to bf16 (above) costs ~13 instructions per 32 weights and kept the
// GEMV compute-bound far below the read bandwidth: random:llama-1b's Q4_0 file decoded at 0.78x
// llama.cpp, its Q4_K_M file at 0.56x. Here each activation row is rounded once per call to int8
// per 32-value block (scale max|x| / 127, round half to even: llama.cpp's q8_0 / q8_1
// activations), and the weights' integer codes multiply it as unsigned bytes, 64 weights (a
// "chunk") per vpdpbusd, then one conversion and one FMA per activation row. The error this adds
// against the fp32 oracle is the activations' rounding, at most max|x_block| / 254 per value.
//
// vpdpbusd multiplies unsigned by signed bytes, so a weight code c stored with an offset o (Q5_0's
// q - 16, Q8_0's signed bytes flipped to c + 128) enters as c and the dot product starts from
// -o * sum(x) instead of 0.
//
// This pairwise path is Q5_0's and Q8_0's; MXFP4 takes four blocks a step as Q4_0 does (its codes
// looked up by vpshufb, ggml_mxfp4.h); Q4_0 and Q4_1 take four blocks a step
// (ggml_q4_groups.h), the K-quants a super-block a step with one activation scale per 256 values
// (ggml_k_quants.h). Lane order here (int32 lane l of a chunk sums 4 activations): Q5_0 pairs two
// 32-value blocks A, B as [A lo nibbles (values 0-15), B lo, A hi (values 16-31), B hi], the order
// two 16-byte loads unpack to, and stores the activations in that order (lane l is block A's for l
// in 0-3 and 8-11); Q8_0 keeps the natural order (lanes 0-7 the chunk's first 32 values, 8-15 the
// rest), how its blocks lie in memory.
enum class Lanes { kPairs, kNatural };

template <int T>
constexpr bool kHasInt8Path = T == kQ5_0 || T == kQ8_0;
template <int T>
constexpr Lanes kLanesOf = T == kQ5_0 ? Lanes::kPairs : Lanes::kNatural;
// log2 of the code offset o above (0: none)
template <int T>
constexpr int kOffsetShift = T == kQ5_0 ? 4 : 7;

struct QuantizedRows {
  const int8_t* q;          // [M][chunks * 64] int8, in the lane order above
  const float* scale;       // [M][chunks * 16]: lane l's block's dx
  const __m512i* lane_sum;  // [M][chunks]: the sum of lane l's 4 int8 values (the code offset's term)
  int64_t chunks;
};

constexpr int kPairLane[16] = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1};  // lane -> block A (0) / B (1)

// x [m, k] bf16 -> its blocks as int8 with their scales, into thread-local buffers; the sums
// only for the weight types that read them (this runs on every decode GEMV call).
template <int T>
inline QuantizedRows quantize_activations(const uint16_t* x, int m, int64_t k) {
  constexpr Lanes L = kLanesOf<T>;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<__m512i> lane_sum;
  const int64_t nb = k / 32, chunks = (nb + 1) / 2;
  q.assign(m * chunks * 64, 0);
  scale.assign(m * chunks * 16, 0.0f);
  lane_sum.resize(m * chunks);
  for (int r = 0; r < m; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      __m512i qlo, qhi;
      const float dx = round_block_to_int8(x + r * k + b * 32, qlo, qhi);
      const int64_t chunk = b / 2, side = b % 2;
      int8_t* dst = q.data() + (r * chunks + chunk) * 64 + side * (L == Lanes::kPairs ? 16 : 32);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (L == Lanes::kPairs ? 32 : 16)), _mm512_cvtsepi32_epi8(qhi));
      float* sc = scale.data() + (r * chunks + chunk) * 16;
      for (int l = 0; l < 16; ++l)
        if ((L == Lanes::kPairs ? kPairLane[l] : l / 8) == side) sc[l] = dx;
    }
    for (int64_t p = 0; p < chunks; ++p) {
      const __m512i xq = _mm512_loadu_si512(q.data() + (r * chunks + p) * 64);
      lane_sum[r * chunks + p] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), xq);
    }
  }
  return {q.data(), scale.data(), lane_sum.data(), chunks};
}

// Two fp16 values (block A's, block B's) spread over the lanes of their blocks.
template <Lanes L>
inline __m512 pair_lanes(const uint8_t* a, const uint8_t* b) {
  uint16_t h[2];
  std::memcpy(&h[0], a, 2);
  std::memcpy(&h[1], b, 2);
  const __m512 two = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(h[0] | (h[1] << 16))));
  const __m512i index = L == Lanes::kPairs ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                                           : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(index, two);
}

alignas(64) constexpr uint8_t kZeroBlock[64] = {};  // an odd last block pairs with zeros

// Q8_0 blocks a, b: their signed codes + 128, natural order.
inline __m512i q8_0_chunk(const uint8_t* a, const uint8_t* b) {
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))),
                                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 1);
  return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
}

// Q5_0 blocks a, b: their nibbles in pair order, + 16 where its qh bit is set.
inline __m512i q5_0_chunk(const uint8_t* a, const uint8_t* b) {
  constexpr int qs = 6;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i both =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + qs))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + qs)), 1);
  const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(both, mask)),
                                       _mm256_and_si256(_mm256_srli_epi16(both, 4), mask), 1);
  // byte order [A 0-15, B 0-15, A 16-31, B 16-31]: qh bits to match
  uint32_t ha, hb;
  std::memcpy(&ha, a + 2, 4);
  std::memcpy(&hb, b + 2, 4);
  const __mmask64 fifth = static_cast<uint64_t>(ha & 0xFFFF) | (static_cast<uint64_t>(hb & 0xFFFF) << 16) |
                          (static_cast<uint64_t>(ha >> 16) << 32) | (static_cast<uint64_t>(hb >> 16) << 48);
  return _mm512_or_si512(q, _mm512_maskz_mov_epi8(fifth, _mm512_set1_epi8(0x10)));
}

template <int T, int R, int M>
inline void vnni_tile(const uint8_t* w, const QuantizedRows& xq, float* y, int64_t n, int64_t r, int64_t k) {
  constexpr int64_t bb = kBlockBytes<T>;
  const int64_t rb = k / 32 * bb;
  __m512 acc[R][M];
  for (int j = 0; j < R; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  const uint8_t* wr = w + r * rb;
  // One chunk of 64 weights per row j: its codes, and its weight scale per lane.
  const auto multiply = [&](int64_t p, const __m512i* wq, const __m512* d) {
    for (int m = 0; m < M; ++m) {
      const int64_t at = m * xq.chunks + p;
      const __m512i x8 = _mm512_loadu_si512(xq.q + at * 64);
      const __m512 dx = _mm512_loadu_ps(xq.scale + at * 16);
      const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(xq.lane_sum[at], kOffsetShift<T>));
      for (int j = 0; j < R; ++j) {
        const __m512i dot = _mm512_dpbusd_epi32(start, wq[j], x8);
        acc[j][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d[j], dx), acc[j][m]);
      }
    }
  };
  __m512i wq[R];
  __m512 d[R];
  const int64_t nb = k / 32;
  for (int64_t p = 0; p < xq.chunks; ++p) {
    const int64_t a = 2 * p, b = a + 1;
    if ((a * bb) % 64 < 2 * bb)
      for (int j = 0; j < R; ++j) prefetch_ahead(wr + j * rb + a * bb);
    for (int j = 0; j < R; ++j) {
      const uint8_t* ba = wr + j * rb + a * bb;
      const uint8_t* bl = b < nb ? ba + bb : kZeroBlock;
      wq[j] = T == kQ8_0 ? q8_0_chunk(ba, bl) : q5_0_chunk(ba, bl);
      d[j] = pair_lanes<kLanesOf<T>>(ba, bl);
    }
    multiply(p, wq, d);
  }
  for (int j = 0; j < R; ++j)
    for (int m = 0; m < M; ++m) y[m * n + r + j] = _mm512_reduce_add_ps(acc[j][m]);
}

template <int T, int M>
void vnni_rows(const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end, int64_t k) {
  const QuantizedRows xq = quantize_activations<T>(x, M, k);
  // One activation row: one weight row at a time, one sequential stream a thread. The default
  // model's Q8_0 head (49152 x 576, 30 MB), two threads, from DRAM: 32.9-34.7 GB/s where 4 rows
  // side by side streamed 18.5. 2-4 activation rows keep 4 weight rows a pass, each activation
  // load feeding 4 of them: 128 x 4096 Q8_0 x 4 rows in L2, one thread, 18.0 GB/s against 8.4.
  constexpr int R = M == 1 ? 1 : 4;
  int64_t r = begin;
  for (; r + R <= end; r += R) vnni_tile<T, R, M>(w, xq, y, n, r, k);
  for (; r < end; ++r) vnni_tile<T, 1, M>(w, xq, y, n, r, k);
}

template <int T, int M>
void rows_kernel(const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end, int64_t k,
                 bool int8_activations) {
  // 1-4 rows only: each (row, activation row) pays a conversion, a scale product and an FMA
  // per two blocks, so 8 rows (2 x 8 accumulators, spilling) ran 3x slower than unpacking to
  // bf16. 4096 x 4096 Q4_0, two threads, int8 against bf16: 0.14 / 0.32 ms at 1 row, 0.31 /
  // 0.41 at 4, 1.75 / 0.56 at 8 (Q4_1: 0.18 / 0.32, 0.40 / 0.41, 1.51 / 0.56).
  // The K-quants at 5-8 rows too: their int8 path keeps a super-block's sums in integers, so an
  // activation row costs two instructions per 64 weights and one conversion per 256
  // (ggml_k_quants.h).
  if (int8_activations) {
    if constexpr ((T == kQ4_0 || T == kQ4_1) && M <= 4) return q4_groups::group_rows<T, M>(w, x, y, n, begin, end, k);
    if constexpr (T == kMXFP4 && M <= 4) return mxfp4::group_rows<M>(w, x, y, n, begin, end, k);
    if constexpr (kHasInt8Path<T> && M <= 4) return vnni_rows<T, M>(w, x, y, n, begin, end, k);
    if constexpr (T == kQ4_K || T == kQ5_K || T == kQ6_K) return k_quants::super_rows<T, M>(w, x, y, n, begin, end, k);
  }
  constexpr int R = M <= 4 ? 4 : 2;  // R * M accumulators: at most 16 of the 32 zmm registers
  int64_t r = begin;
  for (; r + R <= end; r += R) tile_kernel<T, R, M>(w, x, y, n, r, k);
  for (; r < end; ++r) tile_kernel<T, 1, M>(w, x, y, n, r, k);
}

template <int T, int... Ms>
void dispatch_rows(int m, const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end,
                   int64_t k, bool int8_activations) {
  ((m == Ms ? rows_kernel<T, Ms>(w, x, y, n, begin, end, k, int8_activations) : void()), ...);
}

template <int T>
void gemv_type(const uint8_t* w, const uint16_t* x, float* y, int64_t n, int64_t k, int m, int64_t ldy) {
  const int threads = std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>((n + 63) / 64)));
  const bool int8 = ggml_int8_activations();  // read here: the workers below have their own thread_local
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t per = ((n + nt - 1) / nt + 3) / 4 * 4;
    const int64_t begin = std::min<int64_t>(n, t * per), end = std::min<int64_t>(n, begin + per);
    if (begin < end) dispatch_rows<T, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, ldy, begin, end, k, int8);
  }
}

template <int T>
void dequant_rows(const uint8_t* w, uint16_t* out, int64_t n, int64_t k) {
  const int64_t nb = k / 32, rb = k / kBlockValues<T> * kBlockBytes<T>;
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t b = 0; b < nb; ++b) _mm512_storeu_si512(out + r * k + b * 32, (__m512i)dequant_32<T>(w + r * rb, b));
  });
}

bool has_kernel(int type) {
  return type == kQ4_0 || type == kQ4_1 || type == kQ5_0 || type == kQ8_0 || type == kQ4_K || type == kQ5_K ||
         type == kQ6_K || type == kF8E4M3 || type == kMXFP4;
}

void check_weight(const torch::Tensor& weight, int64_t type, int64_t k) {
  TORCH_CHECK(has_kernel(static_cast<int>(type)), "GGML type ", type,
              " has no kernel (Q4_0=2, Q4_1=3, Q5_0=6, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14, MXFP4=39, FP8_E4M3=200)");
  const int64_t rb = ggml_row_bytes(static_cast<int>(type), k);
  TORCH_CHECK(k > 0 && rb > 0, "K=", k, " is not whole blocks of GGML type ", type);
  TORCH_CHECK(weight.scalar_type() == torch::kUInt8 && weight.is_contiguous() && weight.dim() == 2 &&
                  weight.device().is_cpu(),
              "GGML weight: a contiguous uint8 [N, row_bytes] CPU tensor");
  TORCH_CHECK(weight.size(1) == rb, "GGML weight rows hold ", weight.size(1), " bytes; K=", k, " needs ", rb);
}

template <int T>
int64_t row_bytes_of(int64_t k) {
  return k % kBlockValues<T> ? 0 : k / kBlockValues<T> * kBlockBytes<T>;
}

template <int T>
int64_t row_values_of(int64_t bytes) {
  return bytes / kBlockBytes<T> * kBlockValues<T>;
}

}  // namespace

int64_t ggml_row_bytes(int type, int64_t k) {
  switch (type) {
    case kQ4_0: return row_bytes_of<kQ4_0>(k);
    case kQ4_1: return row_bytes_of<kQ4_1>(k);
    case kQ5_0: return row_bytes_of<kQ5_0>(k);
    case kQ8_0: return row_bytes_of<kQ8_0>(k);
    case kQ4_K: return row_bytes_of<kQ4_K>(k);
    case kQ5_K: return row_bytes_of<kQ5_K>(k);
    case kQ6_K: return row_bytes_of<kQ6_K>(k);
    case kF8E4M3: return row_bytes_of<kF8E4M3>(k);
    case kMXFP4: return row_bytes_of<kMXFP4>(k);
    default: return 0;
  }
}

int64_t ggml_row_values(int type, int64_t bytes) {
  switch (type) {
    case kQ4_0: return row_values_of<kQ4_0>(bytes);
    case kQ4_1: return row_values_of<kQ4_1>(bytes);
    case kQ5_0: return row_values_of<kQ5_0>(bytes);
    case kQ8_0: return row_values_of<kQ8_0>(bytes);
    case kQ4_K: return row_values_of<kQ4_K>(bytes);
    case kQ5_K: return row_values_of<kQ5_K>(bytes);
    case kQ6_K: return row_values_of<kQ6_K>(bytes);
    case kF8E4M3: return row_values_of<kF8E4M3>(bytes);
    case kMXFP4: return row_values_of<kMXFP4>(bytes);
    default: return 0;
  }
}

void gemv_ggml(const uint8_t* w, int type, const uint16_t* x, float* y, int64_t n, int64_t k, int m, int64_t ldy) {
  if (ldy == 0) ldy = n;
  switch (type) {
    case kQ4_0: return gemv_type<kQ4_0>(w, x, y, n, k, m, ldy);
    case kQ4_1: return gemv_type<kQ4_1>(w, x, y, n, k, m, ldy);
    case kQ5_0: return gemv_type<kQ5_0>(w, x, y, n, k, m, ldy);
    case kQ8_0: return gemv_type<kQ8_0>(w, x, y, n, k, m, ldy);
    case kQ4_K: return gemv_type<kQ4_K>(w, x, y, n, k, m, ldy);
    case kQ5_K: return gemv_type<kQ5_K>(w, x, y, n, k, m, ldy);
    case kQ6_K: return gemv_type<kQ6_K>(w, x, y, n, k, m, ldy);
    case kF8E4M3: return gemv_type<kF8E4M3>(w, x, y, n, k, m, ldy);
    case kMXFP4: return gemv_type<kMXFP4>(w, x, y, n, k, m, ldy);
    default: TORCH_CHECK(false, "GGML type ", type, " has no kernel");
  }
}

void gemv_ggml_rows(const uint8_t* w, int type, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end,
                    int64_t k, int m, bool int8_activations) {
  switch (type) {
    case kQ4_0: return dispatch_rows<kQ4_0, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kQ4_1: return dispatch_rows<kQ4_1, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kQ5_0: return dispatch_rows<kQ5_0, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kQ8_0: return dispatch_rows<kQ8_0, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kQ4_K: return dispatch_rows<kQ4_K, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kQ5_K: return dispatch_rows<kQ5_K, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kQ6_K: return dispatch_rows<kQ6_K, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kF8E4M3: return dispatch_rows<kF8E4M3, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    case kMXFP4: return dispatch_rows<kMXFP4, 1, 2, 3, 4, 5, 6, 7, 8>(m, w, x, y, n, begin, end, k, int8_activations);
    default: TORCH_CHECK(false, "GGML type ", type, " has no kernel");
  }
}

torch::Tensor ggml_dequantize(torch::Tensor weight, int64_t type, int64_t k) {
  check_weight(weight, type, k);
  const int64_t n = weight.size(0);
  auto out = torch::empty({n, k}, torch::dtype(torch::kBFloat16));
  const uint8_t* w = weight.data_ptr<uint8_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  switch (type) {
    case kQ4_0: dequant_rows<kQ4_0>(w, o, n, k); break;
    case kQ4_1: dequant_rows<kQ4_1>(w, o, n, k); break;
    case kQ5_0: dequant_rows<kQ5_0>(w, o, n, k); break;
    case kQ8_0: dequant_rows<kQ8_0>(w, o, n, k); break;
    case kQ4_K: dequant_rows<kQ4_K>(w, o, n, k); break;
    case kQ5_K: dequant_rows<kQ5_K>(w, o, n, k); break;
    case kF8E4M3: dequant_rows<kF8E4M3>(w, o, n, k); break;
    case kMXFP4: dequant_rows<kMXFP4>(w, o, n, k); break;
    default: dequant_rows<kQ6_K>(w, o, n, k); break;
  }
  return out;
}

torch::Tensor gemm_ggml_skinny(torch::Tensor weight, int64_t type, torch::Tensor x, bool int8_activations) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 2, "x: contiguous bf16 [M, K]");
  const int64_t n = weight.size(0), k = x.size(1), m = x.size(0);
  check_weight(weight, type, k);
  TORCH_CHECK(m >= 1 && m <= kMaxSkinnyRows, "x must have 1..8 rows");
  auto out = torch::empty({m, n}, torch::dtype(torch::kFloat32));
  const GgmlActivations activations(int8_activations);
  gemv_ggml(weight.data_ptr<uint8_t>(), static_cast<int>(type),
            reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), out.data_ptr<float>(), n, k,
            static_cast<int>(m));
  return out.to(torch::kBFloat16);
}

}  // namespace tacit
