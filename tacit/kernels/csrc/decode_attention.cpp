// Decode attention straight from the paged bf16 KV cache, one (row, kv head) item per task.
//
// Why this shape: a decode step of 64 rows at ~300-token contexts reads ~440 MB of KV on
// SmolLM2-135M (~22 ms at this machine's ~19 GB/s for two threads), but the first version
// spent ~130 ms there (standalone timing, 30 layers, random block tables): it scored one key
// at a time (a dot product ending in a horizontal reduction, per key and per query head) and
// loaded and stored the fp32 output accumulator per key. Here (~46 ms on the same timing):
//  - QK scores a tile of 16 keys per query head: 16 independent vdpbf16ps chains, then one
//    transpose-and-add tree turns the 16 accumulators into the 16 scores (~2 shuffle/add per
//    key instead of a ~8-op dependent reduction per key). The 16 K rows come from DRAM once;
//    the other `group` heads that share them hit L1.
//  - PV keeps every output accumulator in registers across all keys. Keys go in pairs: two
//    V rows interleaved (vpunpck{l,h}wd) let one vdpbf16ps add both keys' products to 16
//    columns, and each V row feeds all `group` heads (up to ~20 accumulators).
//  - scratch (scores, probabilities, key offsets) is per thread and reused.
// Widening K and V to fp32 and using FMAs (two per cycle, vs one vdpbf16ps per ~1.8 cycles
// here) was tried and measured no faster (46-56 ms against 46-48): the widening eats the gain.
// Two passes (all scores, then softmax, then PV) keep the numerics of the first version and
// of torch's CPU path: fp32 scores, fp32 softmax, exp'd scores rounded to bf16 before the V
// product, NaN propagating through max and exp; only the fp32 summation order differs.
// Tails of head_dim (Qwen2-style 24-wide heads) use masked loads: zero lanes add nothing and
// no load reads past a head.
#include "decode_attention.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "bf16_common.h"
#include "bf16_vec.h"
#include "attention_common.h"

namespace tacit {
namespace {

using u16 = uint16_t;

// acc[t] += q . krow[t] over NC 32-column chunks from column c0 (the last one masked to
// `tail`: zero lanes add 0, and no load crosses into the next head). q stays in registers.
template <int NC>
inline void qk_chunks(const u16* q, const u16* const* krow, int64_t c0, __mmask32 tail, __m512 acc[kTile]) {
  __m512bh qv[NC];
  for (int c = 0; c < NC; ++c)
    qv[c] = (__m512bh)_mm512_maskz_loadu_epi16(c + 1 < NC ? 0xffffffffu : tail, q + c0 + 32 * c);
#pragma GCC unroll 16
  for (int t = 0; t < kTile; ++t)
    for (int c = 0; c < NC; ++c)
      acc[t] = _mm512_dpbf16_ps(
          acc[t], qv[c], (__m512bh)_mm512_maskz_loadu_epi16(c + 1 < NC ? 0xffffffffu : tail, krow[t] + c0 + 32 * c));
}

// Scores of one query head against 16 key rows (rows past the context point at zeros).
inline __m512 score_tile(const u16* q, const u16* const* krow, int64_t d) {
  __m512 acc[kTile];
  for (int t = 0; t < kTile; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < d; c0 += 256) {  // 8 chunks of 32 per pass keep 16 + 8 zmm live
    const int64_t width = std::min<int64_t>(256, d - c0), nc = (width + 31) / 32;
    const __mmask32 tail = low_bits32(width - 32 * (nc - 1));
    switch (nc) {
      case 1: qk_chunks<1>(q, krow, c0, tail, acc); break;
      case 2: qk_chunks<2>(q, krow, c0, tail, acc); break;
      case 3: qk_chunks<3>(q, krow, c0, tail, acc); break;
      case 4: qk_chunks<4>(q, krow, c0, tail, acc); break;
      case 5: qk_chunks<5>(q, krow, c0, tail, acc); break;
      case 6: qk_chunks<6>(q, krow, c0, tail, acc); break;
      case 7: qk_chunks<7>(q, krow, c0, tail, acc); break;
      default: qk_chunks<8>(q, krow, c0, tail, acc); break;
    }
  }
  return reduce16x16(acc);
}

// Scores of 4 query heads against 16 key rows, 4 keys at a time: each 32-column chunk of a K row
// and of a query feeds 4 vdpbf16ps (acc[4h + t] for head h, key t), so the loads per product
// fall from one (score_tile: every head reloads the K chunk) to a half. A Zen 4 core loads one
// zmm and issues one vdpbf16ps a cycle (231 GFLOP/s measured), so score_tile is load-bound: MLA's
// 16 heads x 576 columns x 4k keys (latents in L3, one thread) scored and softmaxed in 0.62 ms
// (~120 GFLOP/s); this tile 0.46-0.54 ms. Only the tail chunk uses masked loads (all-masked
// loads cost ~15% more here). out[h][16] gets head h's 16 scores times `scale`, masked to mk.
inline void score_tile_4heads(const u16* q, int64_t d, const u16* const* krow, float* out, int64_t out_stride,
                              __mmask16 mk, __m512 scale) {
  __m512 by_group[4];  // lane 4h + t: head h, key 4g + t
  for (int g = 0; g < 4; ++g) {
    __m512 acc[16];
    unroll<16>([&](auto i) { acc[i] = _mm512_setzero_ps(); });
    const u16* const* kg = krow + 4 * g;
    auto chunk = [&](int64_t c0, auto load) {
      __m512bh kc[4], qc[4];
      unroll<4>([&](auto t) { kc[t] = (__m512bh)load(kg[t] + c0); });
      unroll<4>([&](auto h) { qc[h] = (__m512bh)load(q + h * d + c0); });
      unroll<16>([&](auto i) { acc[i] = _mm512_dpbf16_ps(acc[i], qc[i / 4], kc[i % 4]); });
    };
    int64_t c0 = 0;
    for (; c0 + 32 <= d; c0 += 32) chunk(c0, [](const u16* p) { return _mm512_loadu_si512(p); });
    if (c0 < d) {  // masked loads only for the tail: zero lanes add nothing, no load crosses the head
      const __mmask32 m = low_bits32(d - c0);
      chunk(c0, [m](const u16* p) { return _mm512_maskz_loadu_epi16(m, p); });
    }
    by_group[g] = reduce16x16(acc);
  }
  // A 4x4 transpose of 128-bit lanes: head h's lane of every group, in key order.
  const __m512 t0 = _mm512_shuffle_f32x4(by_group[0], by_group[1], 0x44),
               t1 = _mm512_shuffle_f32x4(by_group[2], by_group[3], 0x44),
               t2 = _mm512_shuffle_f32x4(by_group[0], by_group[1], 0xEE),
               t3 = _mm512_shuffle_f32x4(by_group[2], by_group[3], 0xEE);
  const __m512 per_head[4] = {_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD),
                              _mm512_shuffle_f32x4(t2, t3, 0x88), _mm512_shuffle_f32x4(t2, t3, 0xDD)};
  for (int h = 0; h < 4; ++h) _mm512_mask_storeu_ps(out + h * out_stride, mk, _mm512_mul_ps(per_head[h], scale));
}

// p[0..n) <- bf16(exp(s - max)), zero-padded to even n; returns the fp32 sum of the unrounded
// exps. Any NaN score makes the max NaN, so the whole row comes out NaN, as torch's does.
float softmax_rounded(const float* s, u16* p, int64_t n) {
  const __m512 vmx = _mm512_set1_ps(max_or_nan(s, n));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = low_bits16(n - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vmx));
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
    _mm512_mask_storeu_epi16(p + j, m, _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(e)));
  }
  if (n % 2) p[n] = 0;
  return _mm512_reduce_add_ps(vsum);
}

struct PvArgs {
  const u16* p;          // bf16 probabilities, head h's at p + h * p_stride (even, zero-padded)
  int64_t p_stride;
  const float* sums;     // softmax denominators per head
  int64_t ctx;
  const u16* v;          // V cache + this item's kv head + this column chunk
  const u16* zeros;      // a zero row (+ this column chunk) standing in for key ctx when ctx is odd
  const int64_t* offs;   // row offsets of keys 0..ctx (+ kPrefetchKeys + 1 padding)
  u16* out;              // output of the first head + this column chunk
  int64_t d;             // v_dim: stride between heads in `out`
  __mmask32 tail;        // columns of the last of the NW 32-column words inside head_dim
};

// out[h, 32 * NW columns] = sum_j p[h, j] * V[j] / sums[h] for HC heads. Keys go in pairs:
// interleaving two V rows (vpunpck{l,h}wd) lets one vdpbf16ps add both keys' products, half
// the instructions of an FMA per key (which would also need a bf16 -> fp32 widening of V). The
// accumulators stay in registers for the whole context; lane 4l+i of the "lo" accumulator of
// a 32-column word holds column 8l+i, of the "hi" one column 8l+4+i (unpack works per 128 bits).
template <int NW, int HC>
void pv_block(const PvArgs& a) {
  __m512 acc[HC][2 * NW];
  for (int h = 0; h < HC; ++h)
    for (int t = 0; t < 2 * NW; ++t) acc[h][t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < a.ctx; j += 2) {
    const u16* r0 = a.v + a.offs[j];
    const u16* r1 = j + 1 < a.ctx ? a.v + a.offs[j + 1] : a.zeros;
    prefetch_row(a.v + a.offs[j + kPrefetchKeys], NW * 64);
    prefetch_row(a.v + a.offs[j + 1 + kPrefetchKeys], NW * 64);
    __m512i pair[HC];
    for (int h = 0; h < HC; ++h) {
      int32_t bits;
      std::memcpy(&bits, a.p + h * a.p_stride + j, sizeof(bits));
      pair[h] = _mm512_set1_epi32(bits);
    }
    for (int w = 0; w < NW; ++w) {
      const __mmask32 m = w + 1 < NW ? 0xffffffffu : a.tail;
      const __m512i x0 = _mm512_maskz_loadu_epi16(m, r0 + 32 * w), x1 = _mm512_maskz_loadu_epi16(m, r1 + 32 * w);
      const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(x0, x1), hi = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
      for (int h = 0; h < HC; ++h) {
        acc[h][2 * w] = _mm512_dpbf16_ps(acc[h][2 * w], (__m512bh)pair[h], lo);
        acc[h][2 * w + 1] = _mm512_dpbf16_ps(acc[h][2 * w + 1], (__m512bh)pair[h], hi);
      }
    }
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int h = 0; h < HC; ++h) {
    const __m512 sum = _mm512_set1_ps(a.sums[h]);
    u16* o = a.out + h * a.d;
    for (int w = 0; w < NW; ++w) {
      const __mmask32 m = w + 1 < NW ? 0xffffffffu : a.tail;
      const __m512 c0 = _mm512_permutex2var_ps(acc[h][2 * w], first, acc[h][2 * w + 1]);
      const __m512 c1 = _mm512_permutex2var_ps(acc[h][2 * w], second, acc[h][2 * w + 1]);
      _mm512_mask_storeu_epi16(o + 32 * w, m & 0xffffu,
                               _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(_mm512_div_ps(c0, sum))));
      _mm512_mask_storeu_epi16(o + 32 * w + 16, m >> 16,
                               _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(_mm512_div_ps(c1, sum))));
    }
  }
}

template <int NW, int HC>
void pv_rest(int heads, PvArgs a) {
  if constexpr (HC >= 1) {
    if (heads == HC) return pv_block<NW, HC>(a);
    pv_rest<NW, HC - 1>(heads, a);
  }
}

// All `heads` heads, as many at a time as keep ~20 accumulators in the 32 zmm registers.
template <int NW>
void pv_heads(int heads, PvArgs a) {
  constexpr int H = std::max(1, std::min(8, 10 / NW));
  for (; heads >= H; heads -= H) {
    pv_block<NW, H>(a);
    a.p += H * a.p_stride;
    a.sums += H;
    a.out += H * a.d;
  }
  if (heads > 0) pv_rest<NW, H - 1>(heads, a);
}

struct Scratch {
  std::vector<float> scores, sums;
  std::vector<int64_t> offs;
  std::vector<u16> probs, zeros;
};

}  // namespace

void decode_attention(const u16* q, int64_t q_stride, const int64_t* positions, const int64_t* tables,
                      int64_t table_width, const PagedKV& kv, int64_t num_heads, float scale, u16* out, int m) {
  const int64_t d = kv.head_dim, dv = kv.v_dim ? kv.v_dim : d, hkv = kv.num_kv_heads, bs = kv.block_size;
  const int64_t group = num_heads / hkv;
  const HeadSlices work(static_cast<int64_t>(m) * hkv, group, std::max(1, at::get_num_threads()));
  const int64_t splits = work.splits, slice = work.slice, items = work.items;
  const int threads = work.threads;
  // With rows to spare, a thread takes all kv heads of a row in turn: the K/V rows of one
  // slot sit side by side, so the lines the hardware prefetcher pulls in past this head's are
  // the next item's. 64 rows, ctx 300: 42-51 ms against 47-59 with items dealt one by one.
  const int chunk = m >= 2 * threads ? static_cast<int>(hkv) : 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, chunk)
  for (int64_t item = 0; item < items; ++item) {
    thread_local Scratch sc;
    const int64_t pair = item / splits, h0 = item % splits * slice;
    const int64_t r = pair / hkv, g = pair % hkv, ctx = positions[r] + 1;
    const int64_t heads = std::min(slice, group - h0);
    if (heads <= 0) continue;
    const int64_t* table = tables + r * table_width;
    if (static_cast<int64_t>(sc.scores.size()) < heads * ctx) sc.scores.resize(heads * ctx);
    if (static_cast<int64_t>(sc.offs.size()) < ctx + kPrefetchKeys + 1) sc.offs.resize(ctx + kPrefetchKeys + 1);
    if (static_cast<int64_t>(sc.zeros.size()) < d) sc.zeros.resize(d, 0);
    if (static_cast<int64_t>(sc.sums.size()) < heads) sc.sums.resize(heads);
    const int64_t p_stride = (ctx + 1) / 2 * 2;
    if (static_cast<int64_t>(sc.probs.size()) < heads * p_stride) sc.probs.resize(heads * p_stride);
    int64_t* offs = sc.offs.data();
    for (int64_t j = 0; j < ctx; j += bs) {  // key j's row (this kv head) from the block table
      const int64_t base = (table[j / bs] * bs * hkv + g) * d;
      for (int64_t s = 0; s < bs && j + s < ctx; ++s) offs[j + s] = base + s * hkv * d;
    }
    std::fill(offs + ctx, offs + ctx + kPrefetchKeys + 1, offs[0]);  // prefetches past the end stay in bounds

    const int64_t first_head = g * group + h0;
    const u16* qg = q + r * q_stride + first_head * d;
    float* scores = sc.scores.data();
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < ctx; j += kTile) {
      const int64_t nk = std::min<int64_t>(kTile, ctx - j);
      const u16* krow[kTile];
      for (int t = 0; t < kTile; ++t) {
        if (t >= nk) {
          krow[t] = sc.zeros.data();
          continue;
        }
        krow[t] = kv.k + offs[j + t];
        prefetch_row(kv.k + offs[j + t + kPrefetchKeys], d * 2);
      }
      const __mmask16 mk = nk == kTile ? 0xffff : static_cast<__mmask16>((1u << nk) - 1u);
      int64_t h = 0;
      for (; h + 4 <= heads; h += 4) score_tile_4heads(qg + h * d, d, krow, scores + h * ctx + j, ctx, mk, vscale);
      for (; h < heads; ++h)
        _mm512_mask_storeu_ps(scores + h * ctx + j, mk, _mm512_mul_ps(score_tile(qg + h * d, krow, d), vscale));
    }
    for (int64_t h = 0; h < heads; ++h)
      sc.sums[h] = softmax_rounded(scores + h * ctx, sc.probs.data() + h * p_stride, ctx);

    // Each pass re-reads the V rows once per block of heads, and every block unpacks each V pair
    // anew: 128 columns hold 2 heads a block, 64 columns 5. With 8+ heads (MLA's 16, or 8 a thread
    // at batch 1) the 64-column passes win; 32 columns (8 heads a block, 16 strided passes over
    // the rows) took twice as long.
    const int64_t pass_cols = heads >= 8 ? 64 : 128;
    for (int64_t col = 0; col < dv; col += pass_cols) {
      const int64_t width = std::min<int64_t>(pass_cols, dv - col), nw = (width + 31) / 32;
      const PvArgs a{sc.probs.data(), p_stride, sc.sums.data(), ctx, kv.v + col, sc.zeros.data() + col, offs,
                     out + (r * num_heads + first_head) * dv + col, dv, low_bits32(width - 32 * (nw - 1))};
      switch (nw) {
        case 1: pv_heads<1>(static_cast<int>(heads), a); break;
        case 2: pv_heads<2>(static_cast<int>(heads), a); break;
        case 3: pv_heads<3>(static_cast<int>(heads), a); break;
        default: pv_heads<4>(static_cast<int>(heads), a); break;
      }
    }
  }
}

}  // namespace tacit
