// Decode attention over the int8 paged KV cache (kernels/kv_quant.py: per block and kv head,
// block_size rows of int8 values, then their fp32 scales), the scales applied inside the
// kernel: nothing is dequantized to memory.
//
// Why int8: at long contexts the decode step's attention is bytes. SmolLM2-135M at 4k context
// reads 94 MB of bf16 K/V a step (30 layers x 3 kv heads x 4,096 keys x 2 x 128 bytes); int8
// reads 50 MB (64 bytes a row, one cache line, plus 4 for its scale). The arithmetic has to stay cheaper than the bytes saved:
//  - QK: the query head is quantized to int8 once per row (scale max|q| / 127, as llama.cpp
//    does for its q8_0 K cache), so a 64-wide key costs one vpdpbusd per query head. vpdpbusd
//    multiplies unsigned by signed bytes: the cache stores K's bytes as k + 128 (sign bit
//    flipped), so rows go to it straight from memory, and 128 * sum(q) comes off the 16-key
//    tile's reduced sums. score = dot * q_scale * k_scale.
//    The query's int8 rounding is the one approximation beyond the cache's own (scores move by
//    ~0.4% of max|q| * |k|; tests bound it against the dequantize-then-attend reference).
//  - softmax in fp32; each probability is multiplied by its key's V scale and the products are
//    rounded to int16 fixed point (relative to their max), so PV is integer too: four V rows
//    byte-interleaved feed, per 16 columns and query head, two vpdpbusd over the four keys (the
//    weights' high and low bytes; see pv_block_i8). A first version widened V to fp32 and used
//    FMAs: no faster than the bf16 kernel at 4k context (the widening and FMAs made it
//    compute-bound at ~6 GB/s); a second widened V to int16 for one vpdpwssd per key pair.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_common.h"
#include "bf16_common.h"
#include "bf16_vec.h"
#include "decode_attention.h"

namespace tacit {
namespace {

using u16 = uint16_t;
constexpr int64_t kScaleBytes = 4;
// Keys prefetched ahead: rows are 64 bytes, and 128 keys (8 KB) ahead measured 19.3 ms at 4k
// context, 8 rows, 2 threads, against 20.4 ms at 64 keys, 21.8 at 32 (the bf16 kernel's) and no
// gain at 256.
constexpr int kPrefetchKeysI8 = 128;
constexpr int64_t kMaxGroup = 16;  // query heads per kv head (Llama-3-70B: 8; Qwen2.5-7B: 7)

// One query head -> int8 (zero-padded to dpad), its scale and the sum of its int8 values: the
// cache's own row quantizer (quantize_kv_row, below), then the padding and the sum.
void quantize_query(const u16* q, int64_t d, int64_t dpad, int8_t* out, float* scale, int32_t* sum) {
  quantize_kv_row(q, d, out, scale, false);
  std::fill(out + d, out + dpad, 0);
  int32_t total = 0;
  for (int64_t i = 0; i < d; ++i) total += out[i];
  *sum = total;
}

// acc += vpdpbusd(a, b), in place: GCC 12 compiles the intrinsic on a loop-carried accumulator
// as a copy in, the instruction and a copy out (two extra moves per vpdpbusd).
__attribute__((always_inline)) inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}
// The same with b = the dword at p broadcast: one micro-op, the load folded in.
__attribute__((always_inline)) inline __m512i dpbusd_bcast(__m512i acc, __m512i a, const int32_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*p));
  return acc;
}

// dot(q, k_t) for 16 key rows as int32 sums of (k + 128) * q, reduced, then converted to fp32.
inline __m512 score_tile_int8(const int8_t* q, const int8_t* const* krow, int64_t d) {
  // unroll + dpbusd, not a `#pragma GCC unroll` loop over the intrinsic: GCC 12 kept that
  // loop's 16 accumulators in memory and copies (34 register moves and 17 stack accesses per
  // 16 vpdpbusd).
  __m512i acc[kTile];
  unroll<kTile>([&](auto t) { acc[t] = _mm512_setzero_si512(); });
  int64_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) {  // whole 64-byte chunks: vpdpbusd straight from memory
    const __m512i qv = _mm512_loadu_si512(q + c0);
    unroll<kTile>([&](auto t) { acc[t] = dpbusd(acc[t], _mm512_loadu_si512(krow[t] + c0), qv); });
  }
  if (c0 < d) {  // the tail: masked loads (zero bytes times the zero-padded query add nothing)
    const __mmask64 m = low_bits64(d - c0);
    const __m512i qv = _mm512_loadu_si512(q + c0);
    unroll<kTile>([&](auto t) { acc[t] = dpbusd(acc[t], _mm512_maskz_loadu_epi8(m, krow[t] + c0), qv); });
  }
  return reduce16x16_epi32(acc);
}

// Probabilities as int16 fixed point: p'_j * (32767 / max p') rounds to 0..32767, an absolute
// error of at most max p' / 65534 per key, below the bf16 rounding (1/512 relative) that the bf16
// kernel applies to every probability.
constexpr float kProbOne = 32767.0f;
// PV as the MLA kernel's (mla_pv_keys, its note on PV): vpdpwssd, int16 pairs, issues at half
// vpdpbusd's rate on this CPU, so each 15-bit weight goes in as its two bytes, each a vpdpbusd
// over four keys (V stored signed, as vpdpbusd's signed side wants it): the same instruction
// count as one vpdpwssd per key pair, twice the rate. The two byte sums are combined in int32
// (hi * 256 + lo, the exact sum of w * v) and flushed to fp32 every 512 keys, as the vpdpwssd
// version flushed its pair sums: the same integers rounded at the same points, so the same bits.
// High-byte sums stay below 127 x 127 x 512 and the combined one below 2^31.
constexpr int64_t kPvFlushKeys = 512;

// Keys j..j+3 (their `cols` bytes at v + offs[j + k]) interleaved so that, per 128-bit lane L,
// z[i] dword 4L + k holds column 16L + 4i + k of key k; then HB heads' 15-bit weights for those
// keys, as high and low bytes, one vpdpbusd each into acc[8h + i] and acc[8h + 4 + i]. Shared by
// the paged and the MLA kernels' PV (Args: PvArgsI8 or MlaPvArgs); always inlined, so the
// accumulators stay in registers (GCC 12 kept them in memory across calls otherwise).
template <int HB, typename Args>
__attribute__((always_inline)) inline void pv_four_keys(__m512i* acc, const Args& a, int64_t j,
                                                        int64_t prefetch_bytes) {
  __m512i x[4];
  unroll<4>([&](auto k) {
    x[k] = _mm512_maskz_loadu_epi8(a.cols, a.v + a.offs[j + k]);
    if (a.prefetch) prefetch_row(a.v + a.offs[j + k + kPrefetchKeysI8], prefetch_bytes);
  });
  const __m512i l01 = _mm512_unpacklo_epi8(x[0], x[1]), h01 = _mm512_unpackhi_epi8(x[0], x[1]);
  const __m512i l23 = _mm512_unpacklo_epi8(x[2], x[3]), h23 = _mm512_unpackhi_epi8(x[2], x[3]);
  const __m512i z[4] = {_mm512_unpacklo_epi16(l01, l23), _mm512_unpackhi_epi16(l01, l23),
                        _mm512_unpacklo_epi16(h01, h23), _mm512_unpackhi_epi16(h01, h23)};
  unroll<HB>([&](auto h) {
    int32_t bh, bl;
    std::memcpy(&bh, a.w_hi + h * a.w_stride + j, sizeof(bh));
    std::memcpy(&bl, a.w_lo + h * a.w_stride + j, sizeof(bl));
    const __m512i wh = _mm512_set1_epi32(bh), wl = _mm512_set1_epi32(bl);
    unroll<4>([&](auto i) {
      acc[8 * h + i] = dpbusd(acc[8 * h + i], wh, z[i]);
      acc[8 * h + 4 + i] = dpbusd(acc[8 * h + 4 + i], wl, z[i]);
    });
  });
}

// heads' PV totals -> out[h, the chunk's columns] in bf16, times unit[h]: lane L of the four
// z's holds columns 16L..16L+15 in order (pv_four_keys' interleave), undone here.
template <typename Args>
void store_pv_totals(const float (*total)[4][16], int heads, const Args& a) {
  for (int h = 0; h < heads; ++h) {
    const __m512 t0 = _mm512_load_ps(total[h][0]), t1 = _mm512_load_ps(total[h][1]);
    const __m512 t2 = _mm512_load_ps(total[h][2]), t3 = _mm512_load_ps(total[h][3]);
    const __m512 e = _mm512_shuffle_f32x4(t0, t1, 0x44), f = _mm512_shuffle_f32x4(t0, t1, 0xEE);
    const __m512 g = _mm512_shuffle_f32x4(t2, t3, 0x44), k = _mm512_shuffle_f32x4(t2, t3, 0xEE);
    const __m512 cols[4] = {_mm512_shuffle_f32x4(e, g, 0x88), _mm512_shuffle_f32x4(e, g, 0xDD),
                            _mm512_shuffle_f32x4(f, k, 0x88), _mm512_shuffle_f32x4(f, k, 0xDD)};
    const __m512 unit = _mm512_set1_ps(a.unit[h]);
    for (int o = 0; o < 4; ++o)
      _mm256_mask_storeu_epi16(a.out + h * a.d + 16 * o, static_cast<__mmask16>(a.cols >> (16 * o)),
                               (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(cols[o], unit)));
  }
}

struct PvArgsI8 {
  const uint8_t* w_hi;   // head h's weights' high bytes at w_hi + h * w_stride, zero past ctx
  const uint8_t* w_lo;   // their low bytes
  int64_t w_stride;      // a multiple of 32
  const float* unit;     // per head: max p' / 32767 / softmax sum, what one unit of w is worth
  int64_t ctx;
  const int8_t* v;       // V cache + this column chunk
  const int64_t* offs;   // byte offsets of keys 0..ctx (+ kPrefetchKeysI8 + 4 padding: key 0's)
  u16* out;              // output of the first head + this column chunk
  int64_t d;             // stride between heads in `out`
  __mmask64 cols;        // this chunk's columns inside head_dim
  int64_t width;         // their number (bytes to prefetch per key)
  bool prefetch;         // the first heads of a column chunk fetch its rows; the others find them in L2
};

// out[h, 64 columns] = unit[h] * sum_j w[h, j] * V[j] for HC heads, keys four at a time (past
// ctx the weights are zero and offs points at key 0).
template <int HC>
void pv_block_i8(const PvArgsI8& a) {
  alignas(64) float total[HC][4][16] = {};
  const int64_t end = (a.ctx + 3) / 4 * 4;
  for (int64_t j0 = 0; j0 < end; j0 += kPvFlushKeys) {
    const int64_t j1 = std::min(end, j0 + kPvFlushKeys);
    // acc[8h + i]: head h's high-byte sums of z[i]'s columns, acc[8h + 4 + i] its low-byte ones
    __m512i acc[8 * HC];
    unroll<8 * HC>([&](auto i) { acc[i] = _mm512_setzero_si512(); });
    for (int64_t j = j0; j < j1; j += 4) pv_four_keys<HC>(acc, a, j, a.width);
    unroll<HC>([&](auto h) {
      unroll<4>([&](auto i) {
        const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(acc[8 * h + i], 8), acc[8 * h + 4 + i]);
        _mm512_store_ps(total[h][i], _mm512_add_ps(_mm512_load_ps(total[h][i]), _mm512_cvtepi32_ps(sum)));
      });
    });
  }
  store_pv_totals(total, HC, a);
}

constexpr int kPvHeadsI8 = 3;  // 24 accumulators, 4 interleaved V vectors, 2 weight broadcasts

template <int HC>
void pv_rest_i8(int heads, const PvArgsI8& a) {
  if constexpr (HC >= 1) {
    if (heads == HC) return pv_block_i8<HC>(a);
    pv_rest_i8<HC - 1>(heads, a);
  }
}

// All `heads` heads over one 64-column chunk, in blocks of as even a size as fit (7 heads as
// 3+2+2): the first block prefetches the chunk's rows.
void pv_heads_i8(int64_t heads, PvArgsI8 a) {
  const int64_t blocks = (heads + kPvHeadsI8 - 1) / kPvHeadsI8;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t hb = heads / blocks + (b < heads % blocks);
    pv_rest_i8<kPvHeadsI8>(static_cast<int>(hb), a);
    a.w_hi += hb * a.w_stride;
    a.w_lo += hb * a.w_stride;
    a.unit += hb;
    a.out += hb * a.d;
    a.prefetch = false;
  }
}

// w[0, ctx) as its high and low bytes, zero from ctx to w_stride (a multiple of 32).
void split_weight_bytes(const int16_t* w, int64_t ctx, int64_t w_stride, uint8_t* hi, uint8_t* lo) {
  for (int64_t j = 0; j < w_stride; j += 32) {
    const __m512i x = _mm512_maskz_loadu_epi16(low_bits32(ctx - j), w + j);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + j), _mm512_cvtepi16_epi8(_mm512_srli_epi16(x, 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + j),
                        _mm512_cvtepi16_epi8(_mm512_and_si512(x, _mm512_set1_epi16(0xff))));
  }
}

struct ScratchI8 {
  std::vector<float> scores, probs, unit, qscale, vscale;
  std::vector<int64_t> offs, soff;
  std::vector<int32_t> qsum;
  std::vector<int16_t> w;
  std::vector<uint8_t> w_hi, w_lo;
  std::vector<int8_t> qq, zeros;
};

// The PV weights of one query head, in two passes: p'_j = exp(s_j - max) * v_scale_j (the V
// scales folded in) with the softmax sum of the exps, then w_j = round(p'_j * 32767 / max p'),
// zero-padded to even n. Returns what one unit of w is worth: max p' / 32767 / sum. A NaN
// max (a NaN score) gives NaN.
float pv_weights(const float* s, const float* vscale, int64_t n, float mx, float* p, int16_t* w) {
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps(), pmax = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = low_bits16(n - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vmx));
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
    const __m512 pv = _mm512_maskz_mul_ps(m, e, _mm512_maskz_loadu_ps(m, vscale + j));
    pmax = _mm512_max_ps(pv, pmax);
    _mm512_mask_storeu_ps(p + j, m, pv);
  }
  const float top = _mm512_reduce_max_ps(pmax);
  const __m512 k = _mm512_set1_ps(top > 0.0f ? kProbOne / top : 0.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = low_bits16(n - j);
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), k));
    _mm256_mask_storeu_epi16(w + j, m, _mm512_cvtsepi32_epi16(q));
  }
  if (n % 2) w[n] = 0;
  return top / kProbOne / _mm512_reduce_add_ps(vsum);
}

}  // namespace

void quantize_kv_row(const uint16_t* x, int64_t d, int8_t* values, float* scale, bool flip_sign) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < d; ++i) {
    const float v = bf16_to_float(x[i]);
    nan |= std::isnan(v);
    amax = std::max(amax, std::fabs(v));
  }
  // As torch: amax of a row holding NaN is NaN, and so is its scale (the row reads back NaN).
  const float s = nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
  const float div = s == 0.0f ? 1.0f : s;
  for (int64_t i = 0; i < d; ++i) {
    const float v = std::nearbyint(bf16_to_float(x[i]) / div);
    const auto q = static_cast<int8_t>(std::isnan(v) ? 0.0f : std::min(127.0f, std::max(-127.0f, v)));
    values[i] = flip_sign ? static_cast<int8_t>(q ^ 0x80) : q;
  }
  *scale = s;
}

void decode_attention_int8(const u16* q, int64_t q_stride, const int64_t* positions, const int64_t* tables,
                           int64_t table_width, const PagedKVInt8& kv, int64_t num_heads, float scale, u16* out,
                           int m) {
  const int64_t d = kv.head_dim, hkv = kv.num_kv_heads, bs = kv.block_size, group = num_heads / hkv;
  const int64_t dpad = (d + 63) / 64 * 64;
  TORCH_CHECK(group <= kMaxGroup, "decode_attention_int8 takes at most ", kMaxGroup, " query heads per kv head");
  // With 16-token blocks a 16-key tile is one block, and its scales are one vector load.
  const bool scales_in_runs = bs % kTile == 0;
  const int64_t items = static_cast<int64_t>(m) * hkv;
  const int threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  const int chunk = m >= 2 * threads ? static_cast<int>(hkv) : 1;  // as decode_attention: a row's heads together
#pragma omp parallel for num_threads(threads) schedule(dynamic, chunk)
  for (int64_t item = 0; item < items; ++item) {
    thread_local ScratchI8 sc;
    const int64_t r = item / hkv, g = item % hkv, ctx = positions[r] + 1;
    const int64_t* table = tables + r * table_width;
    if (static_cast<int64_t>(sc.scores.size()) < group * ctx) sc.scores.resize(group * ctx);
    if (static_cast<int64_t>(sc.probs.size()) < ctx) sc.probs.resize(ctx);
    if (static_cast<int64_t>(sc.vscale.size()) < ctx) sc.vscale.resize(ctx);
    if (static_cast<int64_t>(sc.offs.size()) < ctx + kPrefetchKeysI8 + 4) {
      sc.offs.resize(ctx + kPrefetchKeysI8 + 4);
      sc.soff.resize(ctx + kPrefetchKeysI8 + 4);
    }
    if (static_cast<int64_t>(sc.zeros.size()) < dpad) sc.zeros.resize(dpad, 0);
    if (static_cast<int64_t>(sc.qq.size()) < group * dpad) sc.qq.resize(group * dpad);
    const int64_t w_stride = (ctx + 31) / 32 * 32;
    if (static_cast<int64_t>(sc.w.size()) < w_stride) sc.w.resize(w_stride);
    if (static_cast<int64_t>(sc.w_hi.size()) < group * w_stride) {
      sc.w_hi.resize(group * w_stride);
      sc.w_lo.resize(group * w_stride);
    }
    if (static_cast<int64_t>(sc.unit.size()) < group) {
      sc.unit.resize(group);
      sc.qscale.resize(group);
      sc.qsum.resize(group);
    }
    int64_t* offs = sc.offs.data();  // key j's value row (this kv head); its scale sits at soff[j]
    int64_t* soff = sc.soff.data();
    const int64_t run = kv.run_bytes();
    for (int64_t j = 0; j < ctx; j += bs) {
      const int64_t base = (table[j / bs] * hkv + g) * run;
      for (int64_t s = 0; s < bs && j + s < ctx; ++s) {
        offs[j + s] = base + s * d;
        soff[j + s] = base + bs * d + s * kScaleBytes;
      }
    }
    // PV's keys past ctx (to a multiple of 4, zero weights) and prefetches past the end stay in bounds
    std::fill(offs + ctx, offs + ctx + kPrefetchKeysI8 + 4, offs[0]);

    const u16* qg = q + r * q_stride + g * group * d;
    for (int64_t h = 0; h < group; ++h)
      quantize_query(qg + h * d, d, dpad, sc.qq.data() + h * dpad, &sc.qscale[h], &sc.qsum[h]);

    float* scores = sc.scores.data();
    // Running max of each head's scores (for the softmax), and whether any was NaN.
    __m512 smax[kMaxGroup];
    __mmask16 nan[kMaxGroup] = {};
    for (int64_t h = 0; h < group; ++h) smax[h] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < ctx; j += kTile) {
      const int64_t nk = std::min<int64_t>(kTile, ctx - j);
      const int8_t* krow[kTile];
      alignas(64) float kscale[kTile] = {};
      const __mmask16 mk = low_bits16(nk);
      if (scales_in_runs) {  // this tile is one block's keys: its scales are 16 floats side by side
        _mm512_store_ps(kscale, _mm512_maskz_loadu_ps(mk, kv.k + soff[j]));
        _mm512_mask_storeu_ps(sc.vscale.data() + j, mk, _mm512_maskz_loadu_ps(mk, kv.v + soff[j]));
      }
      for (int t = 0; t < kTile; ++t) {
        if (t >= nk) {
          krow[t] = sc.zeros.data();
          continue;
        }
        krow[t] = kv.k + offs[j + t];
        if (!scales_in_runs) {
          std::memcpy(&kscale[t], kv.k + soff[j + t], sizeof(float));
          std::memcpy(&sc.vscale[j + t], kv.v + soff[j + t], sizeof(float));
        }
        prefetch_row(kv.k + offs[j + t + kPrefetchKeysI8], d);
      }
      // The scales sit after their block's rows, off the rows' prefetch stream: unprefetched,
      // each tile's K and V scales missed to DRAM, and the kernel ran at half of bf16's speed
      // (4k context, 8 rows, 1 thread: 93 ms against 48).
      for (const int64_t ahead : {j + kPrefetchKeysI8, j + kPrefetchKeysI8 + kTile - 1}) {
        const int64_t at = std::min(ahead, ctx - 1);
        _mm_prefetch(reinterpret_cast<const char*>(kv.k + soff[at]), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(kv.v + soff[at]), _MM_HINT_T0);
      }
      const __m512 ks = _mm512_mul_ps(_mm512_load_ps(kscale), _mm512_set1_ps(scale));
      for (int64_t h = 0; h < group; ++h) {
        const __m512 dot = _mm512_sub_ps(score_tile_int8(sc.qq.data() + h * dpad, krow, d),
                                         _mm512_set1_ps(128.0f * static_cast<float>(sc.qsum[h])));
        const __m512 sv = _mm512_mul_ps(dot, _mm512_mul_ps(ks, _mm512_set1_ps(sc.qscale[h])));
        _mm512_mask_storeu_ps(scores + h * ctx + j, mk, sv);
        nan[h] |= _mm512_mask_cmp_ps_mask(mk, sv, sv, _CMP_UNORD_Q);
        smax[h] = _mm512_mask_max_ps(smax[h], mk, sv, smax[h]);
      }
    }
    for (int64_t h = 0; h < group; ++h) {
      const float mx = nan[h] ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(smax[h]);
      sc.unit[h] = pv_weights(scores + h * ctx, sc.vscale.data(), ctx, mx, sc.probs.data(), sc.w.data());
      split_weight_bytes(sc.w.data(), ctx, w_stride, sc.w_hi.data() + h * w_stride, sc.w_lo.data() + h * w_stride);
    }

    for (int64_t col = 0; col < d; col += 64) {
      const int64_t width = std::min<int64_t>(64, d - col);
      pv_heads_i8(group, PvArgsI8{sc.w_hi.data(), sc.w_lo.data(), w_stride, sc.unit.data(), ctx, kv.v + col, offs,
                                  out + r * num_heads * d + g * group * d + col, d, low_bits64(width), width, true});
    }
  }
}

namespace {
// ---- MLA over the int8 latent cache ----
//
// Every head attends the same rows (16-128 heads; kernels/absorbed_mla_attention.py), so the
// work on a row is done once for all heads, or for as many as the registers hold:
//  - QK: a 16-key tile's rows are transposed so that vector i holds dword i of all 16 rows (64
//    shuffles per 64 bytes of row, for every head), then each head adds one vpdpbusd per dword
//    of its query, the dword broadcast from memory: lanes are keys, so there is no per-head
//    reduction of 16 accumulators (the paged kernel's reduce16x16, ~30 ops per head and tile: as
//    many as the 16 keys' 64-wide rope dot products) and no per-head re-read of the rows.
//  - PV: vpdpwssd (int16; the paged kernel's PV had it until it took this scheme too) issues
//    at half vpdpbusd's rate on this CPU (Zen 5, measured 0.24 against 0.12 ns), so the 15-bit
//    weights go in as their two bytes, each a vpdpbusd of four keys: the int16 version's
//    precision, its instruction count, twice the rate.
//    Four V rows are byte-interleaved (8 shuffles per 64 columns, for up to 3 heads) so each
//    dword lane holds one column of the four keys.
// random:deepseek-v3-1b's shape (16 heads, rank 512 + rope 64), 4k context, one thread, cache
// in L3: 0.38-0.44 ms a request against 1.02 ms for the bf16 kernel. The paged int8 kernel's
// structure (per-head 16-key reductions, vpdpwssd) run on the latent rows measured 1.03 ms.

// 16 rows' bytes [off, off + 64) (only `mask`'s, zero past it), sign bits flipped, as 16 vectors
// of 16 dwords: dst[16 * i + t] = dword i of row t. Flipping makes k + 128, vpdpbusd's unsigned
// side (see mla_decode_attention_int8's note 1).
inline void transpose_rows_u8(const int8_t* const* rows, int64_t off, __mmask64 mask, int32_t* dst) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i a[16], b[16];
  for (int t = 0; t < 16; ++t) a[t] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, rows[t] + off), flip);
  for (int k = 0; k < 8; ++k) {  // per 128-bit lane L: rows 2k, 2k+1 at dwords 4L, 4L+1 (b[2k]) and 4L+2, 4L+3
    b[2 * k] = _mm512_unpacklo_epi32(a[2 * k], a[2 * k + 1]);
    b[2 * k + 1] = _mm512_unpackhi_epi32(a[2 * k], a[2 * k + 1]);
  }
  for (int p = 0; p < 4; ++p) {  // a[4m + p], lane L: rows 4p..4p+3 at dword 4L + m
    a[p] = _mm512_unpacklo_epi64(b[4 * p], b[4 * p + 2]);
    a[4 + p] = _mm512_unpackhi_epi64(b[4 * p], b[4 * p + 2]);
    a[8 + p] = _mm512_unpacklo_epi64(b[4 * p + 1], b[4 * p + 3]);
    a[12 + p] = _mm512_unpackhi_epi64(b[4 * p + 1], b[4 * p + 3]);
  }
  for (int m = 0; m < 4; ++m) {  // gather lane L of the four row groups: dword 4L + m of rows 0..15
    const __m512i* c = a + 4 * m;
    const __m512i e = _mm512_shuffle_i32x4(c[0], c[1], 0x44), f = _mm512_shuffle_i32x4(c[0], c[1], 0xEE);
    const __m512i g = _mm512_shuffle_i32x4(c[2], c[3], 0x44), h = _mm512_shuffle_i32x4(c[2], c[3], 0xEE);
    _mm512_store_si512(dst + 16 * m, _mm512_shuffle_i32x4(e, g, 0x88));
    _mm512_store_si512(dst + 16 * (4 + m), _mm512_shuffle_i32x4(e, g, 0xDD));
    _mm512_store_si512(dst + 16 * (8 + m), _mm512_shuffle_i32x4(f, h, 0x88));
    _mm512_store_si512(dst + 16 * (12 + m), _mm512_shuffle_i32x4(f, h, 0xDD));
  }
}

struct MlaQuery {
  const int32_t* latent;  // head h's int8 latent query as dwords at latent + h * latent_stride
  const int32_t* pe;
  int64_t latent_stride, pe_stride;
  const float* latent_scale;  // per head: its query scale
  const float* pe_scale;
  const int32_t* latent_sum;  // per head: the sum of its int8 values
  const int32_t* pe_sum;
};

// 16 keys' scores for HB heads: dwords [0, nl) of the transposed tile kt are the latent's, then
// np of the rope's; kl, kp: each key's latent and rope scale times the softmax scale.
template <int HB>
void mla_score_heads(const int32_t* kt, int64_t nl, int64_t np, const MlaQuery& q, __m512 kl, __m512 kp,
                     float* scores, int64_t ctx, __mmask16 mk) {
  __m512i acc[HB];
  __m512 s[HB];
  unroll<HB>([&](auto h) { acc[h] = _mm512_setzero_si512(); });
  for (int64_t c = 0; c < nl; ++c) {
    const __m512i t = _mm512_load_si512(kt + 16 * c);
    unroll<HB>([&](auto h) {
      acc[h] = dpbusd_bcast(acc[h], t, q.latent + h * q.latent_stride + c);
    });
  }
  // sum_i (k_i + 128) q_i = q . k + 128 sum q
  unroll<HB>([&](auto h) {
    const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[h], _mm512_set1_epi32(128 * q.latent_sum[h])));
    s[h] = _mm512_mul_ps(dot, _mm512_mul_ps(kl, _mm512_set1_ps(q.latent_scale[h])));
    acc[h] = _mm512_setzero_si512();
  });
  kt += 16 * nl;
  for (int64_t c = 0; c < np; ++c) {
    const __m512i t = _mm512_load_si512(kt + 16 * c);
    unroll<HB>([&](auto h) { acc[h] = dpbusd_bcast(acc[h], t, q.pe + h * q.pe_stride + c); });
  }
  unroll<HB>([&](auto h) {
    const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[h], _mm512_set1_epi32(128 * q.pe_sum[h])));
    _mm512_mask_storeu_ps(scores + h * ctx, mk,
                          _mm512_fmadd_ps(dot, _mm512_mul_ps(kp, _mm512_set1_ps(q.pe_scale[h])), s[h]));
  });
}

constexpr int kMlaScoreHeads = 8;  // query heads scored per pass over a transposed tile

template <int HB>
void mla_score_rest(int heads, const int32_t* kt, int64_t nl, int64_t np, const MlaQuery& q, __m512 kl, __m512 kp,
                    float* scores, int64_t ctx, __mmask16 mk) {
  if constexpr (HB >= 1) {
    if (heads == HB) return mla_score_heads<HB>(kt, nl, np, q, kl, kp, scores, ctx, mk);
    mla_score_rest<HB - 1>(heads, kt, nl, np, q, kl, kp, scores, ctx, mk);
  }
}

// o[h] = unit[h] * sum_j w[h, j] V[j] over one 64-column chunk of the latent, w split in bytes.
struct MlaPvArgs {
  const uint8_t* w_hi;  // head h's weights' high bytes at w_hi + h * w_stride, zero past ctx
  const uint8_t* w_lo;  // their low bytes
  int64_t w_stride;     // a multiple of 4
  const float* unit;    // per head: what one unit of w is worth
  int64_t ctx;
  const int8_t* v;      // the cache + this column chunk
  const int64_t* offs;  // byte offsets of keys 0..ctx (+ kPrefetchKeysI8 + 4 padding: key 0's)
  u16* out;             // output of the first head + this column chunk
  int64_t d;            // stride between heads in `out`
  __mmask64 cols;       // this chunk's columns inside the latent
  bool prefetch;        // the first heads of a column chunk fetch its rows; the others find them in L2
};

// Weights up to 127 (high byte) or 255 (low) times |v| <= 127, four keys a vpdpbusd: int32
// accumulators flushed to fp32 every 16,384 key quads stay below 2^31.
constexpr int64_t kFlushQuads = 16384;

// Keys [j0, j1) of HB heads (j0 a multiple of 4, at most kFlushQuads quads; past ctx the
// weights are zero and offs points at key 0), added to total[h][i]: the four z's columns, unpermuted.
template <int HB>
void mla_pv_keys(const MlaPvArgs& a, int64_t j0, int64_t j1, float (*total)[4][16]) {
  // acc[8h + i]: head h's high-byte sums of z[i]'s columns, acc[8h + 4 + i] its low-byte ones
  __m512i acc[8 * HB];
  unroll<8 * HB>([&](auto i) { acc[i] = _mm512_setzero_si512(); });
  for (int64_t j = j0; j < j1; j += 4) pv_four_keys<HB>(acc, a, j, 65);  // the chunk's one or two lines
  unroll<HB>([&](auto h) {
    unroll<4>([&](auto i) {
      const __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[8 * h + i]), _mm512_set1_ps(256.0f),
                                         _mm512_cvtepi32_ps(acc[8 * h + 4 + i]));
      _mm512_store_ps(total[h][i], _mm512_add_ps(_mm512_load_ps(total[h][i]), sum));
    });
  });
}

template <int HB>
void mla_pv_heads(const MlaPvArgs& a) {
  alignas(64) float total[HB][4][16] = {};
  const int64_t quads_end = (a.ctx + 3) / 4 * 4;
  for (int64_t j0 = 0; j0 < quads_end; j0 += 4 * kFlushQuads)
    mla_pv_keys<HB>(a, j0, std::min(quads_end, j0 + 4 * kFlushQuads), total);
  store_pv_totals(total, HB, a);
}

constexpr int kMlaPvHeads = 3;

template <int HB>
void mla_pv_rest(int heads, const MlaPvArgs& a) {
  if constexpr (HB >= 1) {
    if (heads == HB) return mla_pv_heads<HB>(a);
    mla_pv_rest<HB - 1>(heads, a);
  }
}

struct MlaScratch {
  std::vector<float> scores, probs, unit, vscale, qscale;
  std::vector<int64_t> offs;
  std::vector<int32_t> qsum, qq, kt;  // qq: the heads' int8 queries, four to a dword
  std::vector<int16_t> w;
  std::vector<uint8_t> w_hi, w_lo;
  std::vector<int8_t> zeros;

  void fit(int64_t heads, int64_t ctx, int64_t q_dwords, int64_t row) {
    const auto grow = [](auto& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    };
    const int64_t w_stride = (ctx + 31) / 32 * 32;
    grow(scores, heads * ctx);
    grow(probs, ctx);
    grow(vscale, ctx);
    grow(offs, ctx + kPrefetchKeysI8 + 4);
    grow(w, w_stride);
    grow(w_hi, heads * w_stride);
    grow(w_lo, heads * w_stride);
    grow(unit, heads);
    grow(qscale, 2 * heads);
    grow(qsum, 2 * heads);
    grow(qq, heads * q_dwords);
    grow(kt, 16 * q_dwords + 16);  // + 16: room to align to 64 bytes
    grow(zeros, std::max<int64_t>(row, 64));
  }
};

}  // namespace

void mla_decode_attention_int8(const u16* q, int64_t q_stride, const int64_t* positions, const int64_t* tables,
                               int64_t table_width, const LatentCacheInt8& kv, int64_t num_heads, float scale,
                               u16* out, int m) {
  const int64_t rank = kv.rank, rope = kv.rope, bs = kv.block_size, row = kv.row_bytes(), d = rank + rope;
  const int64_t pe_off = rank + kScaleBytes;  // the rope values' byte offset in a row
  const int64_t lpad = (rank + 63) / 64 * 64, ppad = (rope + 63) / 64 * 64;
  const int64_t nl = (rank + 3) / 4, np = (rope + 3) / 4;  // dwords of each part
  const int64_t q_dwords = (lpad + ppad) / 4;
  const HeadSlices work(m, num_heads, std::max(1, at::get_num_threads()));
#pragma omp parallel for num_threads(work.threads) schedule(dynamic, 1)
  for (int64_t item = 0; item < work.items; ++item) {
    thread_local MlaScratch sc;
    const int64_t r = item / work.splits, h0 = item % work.splits * work.slice;
    const int64_t heads = std::min(work.slice, num_heads - h0), ctx = positions[r] + 1;
    if (heads <= 0) continue;
    const int64_t* table = tables + r * table_width;
    const int64_t w_stride = (ctx + 31) / 32 * 32;
    sc.fit(heads, ctx, q_dwords, row);
    int64_t* offs = sc.offs.data();  // key j's row, in bytes from the cache's start
    for (int64_t j = 0; j < ctx; j += bs) {
      const int64_t base = table[j / bs] * bs * row;
      for (int64_t s = 0; s < bs && j + s < ctx; ++s) offs[j + s] = base + s * row;
    }
    std::fill(offs + ctx, offs + ctx + kPrefetchKeysI8 + 4, offs[0]);  // prefetches past the end stay in bounds

    // Each head's latent and rope parts quantized apart (their sizes differ, as the cache's two
    // scales do), each zero-padded to 64 bytes: head h's at qq + h * q_dwords, rope after lpad.
    auto* qq = reinterpret_cast<int8_t*>(sc.qq.data());
    float* qscale = sc.qscale.data();
    int32_t* qsum = sc.qsum.data();
    const u16* qr = q + r * q_stride + h0 * d;
    for (int64_t h = 0; h < heads; ++h) {
      int8_t* qh = qq + h * 4 * q_dwords;
      quantize_query(qr + h * d, rank, lpad, qh, &qscale[h], &qsum[h]);
      quantize_query(qr + h * d + rank, rope, ppad, qh + lpad, &qscale[heads + h], &qsum[heads + h]);
    }

    // 1: The cache keeps the latent signed (kv_quant.py pack_rows; MLAWriteKV, the torch path
    // and the PV below read it so), but vpdpbusd wants one unsigned side. The scores flip each
    // row's sign bits in registers while transposing the tile: 16 xors per 64 bytes of 16 rows,
    // once for all heads (a 16-head tile takes 2,304 vpdpbusd), then take 128 * sum(q) off each
    // head's sums. Storing K flipped, as the paged cache does, would change the layout, its
    // writer and its torch reader and cost a flip back per V row in PV; making the query the
    // unsigned side (q + 128) would need each row's sum(k): one more vpdpbusd per dword and tile.
    float* scores = sc.scores.data();
    auto* kt = reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(sc.kt.data()) + 63) & ~uintptr_t{63});
    const int8_t* zeros = sc.zeros.data();
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < ctx; j += kTile) {
      const int64_t nk = std::min<int64_t>(kTile, ctx - j);
      const __mmask16 mk = low_bits16(nk);
      const int8_t* krow[kTile];
      alignas(64) float ls[kTile] = {}, ps[kTile] = {};
      for (int t = 0; t < kTile; ++t) {
        if (t >= nk) {
          krow[t] = zeros;
          continue;
        }
        krow[t] = kv.rows + offs[j + t];
        std::memcpy(&ls[t], krow[t] + rank, sizeof(float));
        std::memcpy(&ps[t], krow[t] + pe_off + rope, sizeof(float));
        prefetch_row(kv.rows + offs[j + t + kPrefetchKeysI8], row);
      }
      for (int64_t c = 0; c < rank; c += 64) transpose_rows_u8(krow, c, low_bits64(rank - c), kt + 4 * c);
      for (int64_t c = 0; c < rope; c += 64)
        transpose_rows_u8(krow, pe_off + c, low_bits64(rope - c), kt + 16 * nl + 4 * c);
      const __m512 kl = _mm512_mul_ps(_mm512_load_ps(ls), vscale), kp = _mm512_mul_ps(_mm512_load_ps(ps), vscale);
      _mm512_mask_storeu_ps(sc.vscale.data() + j, mk, _mm512_load_ps(ls));
      for (int64_t h = 0; h < heads; h += kMlaScoreHeads) {
        const auto* qd = reinterpret_cast<const int32_t*>(qq + h * 4 * q_dwords);
        const MlaQuery mq{qd,        qd + lpad / 4,      q_dwords, q_dwords,
                          qscale + h, qscale + heads + h, qsum + h, qsum + heads + h};
        mla_score_rest<kMlaScoreHeads>(static_cast<int>(std::min<int64_t>(kMlaScoreHeads, heads - h)), kt, nl, np, mq,
                                       kl, kp, scores + h * ctx + j, ctx, mk);
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* sh = scores + h * ctx;
      sc.unit[h] = pv_weights(sh, sc.vscale.data(), ctx, max_or_nan(sh, ctx), sc.probs.data(), sc.w.data());
      split_weight_bytes(sc.w.data(), ctx, w_stride, sc.w_hi.data() + h * w_stride, sc.w_lo.data() + h * w_stride);
    }

    for (int64_t col = 0; col < rank; col += 64) {
      MlaPvArgs a{sc.w_hi.data(), sc.w_lo.data(), w_stride, sc.unit.data(), ctx, kv.rows + col, offs,
                  out + (r * num_heads + h0) * rank + col, rank, low_bits64(rank - col), true};
      // Heads in blocks of as even a size as fit: 16 heads as 3+3+3+3+2+2, not 3+3+3+3+3+1.
      const int64_t blocks = (heads + kMlaPvHeads - 1) / kMlaPvHeads;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t hb = heads / blocks + (b < heads % blocks);
        mla_pv_rest<kMlaPvHeads>(static_cast<int>(hb), a);
        a.w_hi += hb * w_stride;
        a.w_lo += hb * w_stride;
        a.unit += hb;
        a.out += hb * rank;
        a.prefetch = false;
      }
    }
  }
}

}  // namespace tacit
