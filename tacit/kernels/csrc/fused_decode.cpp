// A whole decode step in one C++ call: GQA layers (the Llama family) or MLA layers (DeepSeek-V3).
//
// Why: at batch 1 a decode step of SmolLM2-135M streams 269 MB of weights (~11 ms at this
// machine's ~23 GB/s), but eager torch ran it as ~1,500 small ops (norms, rotary, KV writes
// and gathers, SDPA over one query) costing 2-30 us of dispatch each: ~15 ms of overhead on
// top of the 9 ms of GEMVs. Here the step is one call, the layer's glue is a few vector
// loops between the GEMVs, and attention reads K/V straight out of the paged cache blocks
// instead of gathering the whole context into a padded copy first.
//
// Numerics follow eager torch's bf16 path op by op: each elementwise op computes in fp32 and
// rounds to bf16 where torch would produce a bf16 tensor (RMSNorm: fp32 statistics, round,
// then times the weight and round; rotary: each product and sum rounded; silu then times
// up, each rounded). GEMVs accumulate in fp32 and round once, like the 1-8 row kernel the
// torch path already uses. Attention computes scores, softmax and the weighted sum in fp32
// and rounds the exp'd scores to bf16 before the V product, as torch's CPU flash attention
// does for bf16 inputs. What remains different is fp32 summation order, which is why tests
// compare against the torch path with a tolerance rather than bit for bit.
#include "fused_decode.h"

#include <chrono>

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "bf16_common.h"
#include "bf16_vec.h"
#include "decode_attention.h"
#include "fused_moe.h"
#include "ggml_gemv.h"

namespace tacit {

// csrc/decode_attention_op.cpp and csrc/head_bmm.cpp: MLA's absorbed decode, as the torch path calls them.
torch::Tensor mla_decode_attention(torch::Tensor q, torch::Tensor latent_cache, torch::Tensor positions,
                                   torch::Tensor block_tables, double scale, int64_t v_dim);
torch::Tensor head_bmm_bf16(torch::Tensor x, torch::Tensor w);

namespace {

using u16 = uint16_t;

// HF's RMSNorm in bf16: statistics in fp32, normalize, round, times the weight, round.
void rms_norm(const u16* x, const u16* weight, u16* out, int64_t n, float eps) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = load16(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  float ss = _mm512_reduce_add_ps(acc);
  for (; i < n; ++i) ss += bf16_to_float(x[i]) * bf16_to_float(x[i]);
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m512 r = _mm512_set1_ps(rstd);
  for (i = 0; i + 16 <= n; i += 16)
    store16(out + i, _mm512_mul_ps(load16(weight + i), round16(_mm512_mul_ps(load16(x + i), r))));
  for (; i < n; ++i) out[i] = float_to_bf16(bf16_to_float(weight[i]) * round_bf16(bf16_to_float(x[i]) * rstd));
}

// dst = round(src_f32) [+ bias, rounded again: torch adds the bias to the rounded GEMV output].
void round_out(const float* src, const u16* bias, u16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(src + i);
    if (bias) v = _mm512_add_ps(round16(v), load16(bias + i));
    store16(dst + i, v);
  }
  for (; i < n; ++i) dst[i] = float_to_bf16(bias ? round_bf16(src[i]) + bf16_to_float(bias[i]) : src[i]);
}

// x = round(x + round(delta_f32) [+ bias]): the residual add after o_proj and down_proj.
void residual_add(u16* x, const float* delta, const u16* bias, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 d = round16(_mm512_loadu_ps(delta + i));
    if (bias) d = round16(_mm512_add_ps(d, load16(bias + i)));
    store16(x + i, _mm512_add_ps(load16(x + i), d));
  }
  for (; i < n; ++i) {
    float d = round_bf16(delta[i]);
    if (bias) d = round_bf16(d + bf16_to_float(bias[i]));
    x[i] = float_to_bf16(bf16_to_float(x[i]) + d);
  }
}

// Half-split rotary on one head in place, each product and sum rounded as in rotate_neox.
void rotate_neox(u16* x, const u16* cos, const u16* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = bf16_to_float(x[i]), x2 = bf16_to_float(x[i + half]);
    const float c = bf16_to_float(cos[i]), s = bf16_to_float(sin[i]);
    x[i] = float_to_bf16(round_bf16(x1 * c) - round_bf16(x2 * s));
    x[i + half] = float_to_bf16(round_bf16(x2 * c) + round_bf16(x1 * s));
  }
}

// DeepSeek's pairwise rotary on one head in place: (x0, x1), (x2, x3)... rotated, written out
// de-interleaved (layers/rotary.py rotate_interleaved), each product and sum rounded.
void rotate_interleaved(u16* x, const u16* cos, const u16* sin, int64_t half) {
  u16 out[256];
  TORCH_CHECK(half <= 128, "rotary width above 256");
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = bf16_to_float(x[2 * i]), x2 = bf16_to_float(x[2 * i + 1]);
    const float c = bf16_to_float(cos[i]), s = bf16_to_float(sin[i]);
    out[i] = float_to_bf16(round_bf16(x1 * c) - round_bf16(x2 * s));
    out[i + half] = float_to_bf16(round_bf16(x2 * c) + round_bf16(x1 * s));
  }
  std::memcpy(x, out, 2 * half * sizeof(u16));
}

// Up to this many rows, a GGML weight is multiplied 8 rows a pass by the block kernel rather than
// dequantized to a bf16 matrix for oneDNN: at 16 rows the dequantize-then-GEMM step of the
// default model took 68.6 ms (tacit bench latency --batch-sizes 16) against bf16's 44.4 ms.
constexpr int kGgmlChunkedRows = 32;

// y = x @ dense^T as layers/linear.py phrases it past the skinny kernels (see project below).
const torch::Tensor& dense_project(const torch::Tensor& dense, const torch::Tensor& bias, const uint16_t* x, float* y,
                                   int m) {
  static const torch::Tensor kNone;
  const int64_t n = dense.size(0), k = dense.size(1);
  auto xt = torch::from_blob(const_cast<uint16_t*>(x), {m, k}, torch::dtype(torch::kBFloat16));
  auto out = m <= 32 ? torch::mm(dense, xt.t()).t()
                     : torch::linear(xt, dense, bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt);
  torch::from_blob(y, {m, n}, torch::dtype(torch::kFloat32)).copy_(out);
  return m <= 32 ? bias : kNone;
}

// y[m, n] (fp32) = x[m, k] @ w^T. Up to 8 rows the AVX512-BF16 kernels read each weight once
// for all of them (ggml_gemv.cpp for a GGML-quantized weight). More rows: oneDNN (AMX on this
// CPU), phrased exactly as layers/linear.py phrases it for the torch path, so both paths pick
// the same GEMM; a GGML weight takes 8 rows a pass up to kGgmlChunkedRows and is dequantized
// to bf16 past that, as GGMLLinearMethod does.
// Returns the bias still to add: F.linear (past 32 rows) adds it inside the GEMM, with one
// rounding, the other phrasings add it to the rounded output.
const torch::Tensor& project(const torch::Tensor& w, int type, const torch::Tensor& bias, const uint16_t* x, float* y,
                             int m) {
  const bool bf16 = type == kBf16;
  const int64_t n = w.size(0), k = bf16 ? w.size(1) : ggml_row_values(type, w.size(1));
  if (m <= kMaxSkinnyRows) {
    if (bf16)
      gemv_bf16(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), x, y, n, k, m);
    else
      gemv_ggml(w.data_ptr<uint8_t>(), type, x, y, n, k, m);
    return bias;
  }
  if (!bf16 && m <= kGgmlChunkedRows) {  // 8 rows a pass over the blocks: see kGgmlChunkedRows
    for (int r = 0; r < m; r += kMaxSkinnyRows)
      gemv_ggml(w.data_ptr<uint8_t>(), type, x + static_cast<int64_t>(r) * k, y + static_cast<int64_t>(r) * n, n, k,
                std::min(kMaxSkinnyRows, m - r));
    return bias;
  }
  return dense_project(bf16 ? w : ggml_dequantize(w, type, k), bias, x, y, m);
}

// A merged projection of parts in different GGML types: each part into its own columns of y,
// 8 rows a pass up to kGgmlChunkedRows, the parts dequantized and stacked past that.
const torch::Tensor& project(const Projection& p, const torch::Tensor& bias, const uint16_t* x, float* y, int m) {
  if (p.parts.size() == 1) return project(p.parts[0], p.types[0], bias, x, y, m);
  int64_t n = 0;
  for (const auto& w : p.parts) n += w.size(0);
  const int64_t k = ggml_row_values(p.types[0], p.parts[0].size(1));
  if (m <= kGgmlChunkedRows) {
    int64_t column = 0;
    for (size_t i = 0; i < p.parts.size(); ++i) {
      for (int r = 0; r < m; r += kMaxSkinnyRows)
        gemv_ggml(p.parts[i].data_ptr<uint8_t>(), p.types[i], x + static_cast<int64_t>(r) * k,
                  y + static_cast<int64_t>(r) * n + column, p.parts[i].size(0), k, std::min(kMaxSkinnyRows, m - r), n);
      column += p.parts[i].size(0);
    }
    return bias;
  }
  std::vector<torch::Tensor> dense;
  for (size_t i = 0; i < p.parts.size(); ++i) dense.push_back(ggml_dequantize(p.parts[i], p.types[i], k));
  return dense_project(torch::cat(dense), bias, x, y, m);
}

const u16* bf16_ptr(const torch::Tensor& t) {
  return t.defined() ? reinterpret_cast<const u16*>(t.data_ptr<at::BFloat16>()) : nullptr;
}

// A sparse MoE MLP on the normed rows, as Qwen3-MoE's torch path computes it, in two parts so
// the profiler can time them apart. Routing: the router product rounded to bf16 (F.linear in the
// model's dtype), then fused_moe.cpp's softmax top-k -> (weights, ids); f32 is scratch.
std::tuple<torch::Tensor, torch::Tensor> moe_mlp_route(const DecoderLayerWeights& w, const u16* normed, float* f32,
                                                       int m) {
  const int64_t experts = w.router.size(0);
  project(w.router, kBf16, torch::Tensor(), normed, f32, m);
  auto logits = torch::empty({m, experts}, torch::dtype(torch::kFloat32));
  float* l = logits.data_ptr<float>();
  for (int64_t i = 0; i < m * experts; ++i) l[i] = round_bf16(f32[i]);
  return moe_route(logits, std::nullopt, w.top_k, false, w.renormalize, 1, 1, 1.0);
}

// DeepSeek-V3's routing as models/deepseek_v3.py runs it: F.linear(x.float(), weight.float()) (the
// same ATen call, so the same float32 logits), then fused_moe.cpp's grouped sigmoid top-k.
std::tuple<torch::Tensor, torch::Tensor> grouped_moe_route(const DecoderLayerWeights& w, const u16* normed, int m) {
  const int64_t h = w.router_f32.size(1);
  auto x = torch::from_blob(const_cast<u16*>(normed), {m, h}, torch::dtype(torch::kBFloat16)).to(torch::kFloat32);
  auto logits = torch::linear(x, w.router_f32).contiguous();
  return moe_route(logits, w.correction_bias, w.top_k, true, w.renormalize, w.groups, w.topk_groups, w.scaling);
}

// The routed experts' weighted sum (+ the shared expert, when fused) -> out_f32 [m, hidden] (bf16 values).
void moe_mlp_experts(const DecoderLayerWeights& w, const u16* normed, const torch::Tensor& weights,
                     const torch::Tensor& ids, float* out_f32, int m) {
  const int64_t h = w.router_f32.defined() ? w.router_f32.size(1) : w.router.size(1);
  auto x = torch::from_blob(const_cast<u16*>(normed), {m, h}, torch::dtype(torch::kBFloat16));
  std::optional<torch::Tensor> slots, shared_w13, shared_w2;
  if (w.expert_slots) slots = w.expert_slots(ids, x);
  if (w.shared_w13.defined()) shared_w13 = w.shared_w13, shared_w2 = w.shared_w2;
  auto y = moe_experts(x, weights, ids, w.experts_w13, w.experts_w13_type, w.experts_w2, w.experts_w2_type,
                       shared_w13, w.shared_w13_type, shared_w2, w.shared_w2_type, slots);
  torch::from_blob(out_f32, {m, h}, torch::dtype(torch::kFloat32)).copy_(y);
}

// Adds the time since the last mark to a phase of a layer when timing is on. One steady_clock
// read (~20 ns) per phase boundary, 7 a layer: ~5 us on a 30-layer step of ~11 ms (0.04%); off,
// a branch on a bool the step never changes.
class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;
  PhaseClock(std::vector<double>* seconds, bool on) : seconds_(on ? seconds : nullptr) {
    if (seconds_) last_ = Clock::now();
  }
  void mark(int64_t layer, int phase) {
    if (!seconds_) return;
    const auto now = Clock::now();
    (*seconds_)[layer * kNumPhases + phase] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  // Drops the time since the last mark (an all-reduce: timed on its own).
  void skip() {
    if (seconds_) last_ = Clock::now();
  }

 private:
  std::vector<double>* seconds_;
  Clock::time_point last_;
};

// What one step's MLA attention needs besides the layer's weights.
struct MlaStep {
  const int64_t* pos;
  const torch::Tensor& positions;
  const torch::Tensor& block_tables;
  const u16 *cos, *sin;  // [max_positions, rope / 2]
  int64_t heads, block_size;
  float eps, scale;
};

// One layer's MLA attention for m decode rows, op for op as models/deepseek_v3.py MLAAttention
// and the absorbed backend (kernels/absorbed_mla_attention.py) run it: the query (q_a, its norm,
// q_b), the latent and rotary key (kv_a, the latent's norm), the interleaved rotary, the cache
// row written, then q_nope absorbed through W_UK, attention over the latent rows in place, and
// W_UV: normed [m, hidden] -> attn [m, heads * v] (o_proj's input). scratch: reused bf16 space.
void mla_attention(const MlaWeights& a, const MlaStep& st, const u16* normed, float* f32, std::vector<u16>& scratch,
                   u16* attn, int m, PhaseClock& clock, int64_t l) {
  const int64_t heads = st.heads, rank = a.rank, rope = a.rope, nope = a.nope, hd = nope + rope;
  const int64_t qw = heads * hd, kvw = rank + rope, qa = a.q_a.defined() ? a.q_a_norm.size(0) : 0;
  scratch.resize(static_cast<size_t>(m) * (qa + qw + kvw));
  u16* q_low = scratch.data();
  u16* q = q_low + m * qa;
  u16* kv = q + m * qw;
  if (qa) {
    project(a.q_a, torch::Tensor(), normed, f32, m);
    for (int r = 0; r < m; ++r) round_out(f32 + r * qa, nullptr, q_low + r * qa, qa);
    clock.mark(l, kPhaseGemm);
    for (int r = 0; r < m; ++r) rms_norm(q_low + r * qa, bf16_ptr(a.q_a_norm), q_low + r * qa, qa, st.eps);
    clock.mark(l, kPhaseNorm);
  }
  project(a.q_b, torch::Tensor(), qa ? q_low : normed, f32, m);
  for (int r = 0; r < m; ++r) round_out(f32 + r * qw, nullptr, q + r * qw, qw);
  project(a.kv_a, torch::Tensor(), normed, f32, m);
  for (int r = 0; r < m; ++r) round_out(f32 + r * kvw, nullptr, kv + r * kvw, kvw);
  clock.mark(l, kPhaseGemm);
  for (int r = 0; r < m; ++r) rms_norm(kv + r * kvw, bf16_ptr(a.kv_a_norm), kv + r * kvw, rank, st.eps);
  clock.mark(l, kPhaseNorm);

  const int64_t width = st.block_tables.size(1), bs = st.block_size;
  const int64_t* tables = st.block_tables.data_ptr<int64_t>();
  const bool int8_cache = a.latent_cache.scalar_type() == torch::kInt8;
  for (int r = 0; r < m; ++r) {
    const u16* cos = st.cos + st.pos[r] * (rope / 2);
    const u16* sin = st.sin + st.pos[r] * (rope / 2);
    for (int64_t head = 0; head < heads; ++head) rotate_interleaved(q + r * qw + head * hd + nope, cos, sin, rope / 2);
    u16* row = kv + r * kvw;
    rotate_interleaved(row + rank, cos, sin, rope / 2);
    const int64_t slot = tables[r * width + st.pos[r] / bs] * bs + st.pos[r] % bs;
    if (int8_cache) {  // kernels/kv_quant.py pack_rows, latent then rotary key: values, then the fp32 scale
      int8_t* out = a.latent_cache.data_ptr<int8_t>() + slot * (kvw + 8);
      float scale;
      quantize_kv_row(row, rank, out, &scale, false);
      std::memcpy(out + rank, &scale, sizeof(scale));
      quantize_kv_row(row + rank, rope, out + rank + 4, &scale, false);
      std::memcpy(out + rank + 4 + rope, &scale, sizeof(scale));
    } else {
      std::memcpy(reinterpret_cast<u16*>(a.latent_cache.data_ptr<at::BFloat16>()) + slot * kvw, row,
                  kvw * sizeof(u16));
    }
  }
  // The per-head products as absorbed_attend runs them: csrc/head_bmm.cpp where its shapes fit,
  // else torch.bmm over the heads.
  auto per_head = [&](const torch::Tensor& x, const torch::Tensor& w) {
    return a.head_bmm ? head_bmm_bf16(x, w) : torch::bmm(x.transpose(0, 1), w).transpose(0, 1);
  };
  auto qt = torch::from_blob(q, {m, heads, hd}, torch::dtype(torch::kBFloat16));
  auto q_abs = torch::cat({per_head(qt.narrow(2, 0, nope), a.w_uk), qt.narrow(2, nope, rope)}, 2);
  auto o_latent = mla_decode_attention(q_abs, a.latent_cache, st.positions, st.block_tables, st.scale, rank);
  auto out = per_head(o_latent, a.w_uv_t).contiguous();  // [m, heads, v]
  std::memcpy(attn, out.data_ptr<at::BFloat16>(), out.numel() * sizeof(u16));
  clock.mark(l, kPhaseAttention);
}

// A sparse MLP's expert stacks and top-k (shapes and types are checked per call by moe_experts).
void set_experts(DecoderLayerWeights& w, const torch::Tensor& w13, int64_t w13_type, const torch::Tensor& w2,
                 int64_t w2_type, int64_t top_k, bool renormalize) {
  w.experts_w13 = w13;
  w.experts_w2 = w2;
  w.experts_w13_type = static_cast<int>(w13_type);
  w.experts_w2_type = static_cast<int>(w2_type);
  w.top_k = top_k;
  w.renormalize = renormalize;
}

torch::Tensor checked(const torch::Tensor& t, const char* what, std::vector<int64_t> shape) {
  TORCH_CHECK(t.scalar_type() == torch::kBFloat16 && t.is_contiguous() && t.device().is_cpu(), what,
              ": must be a contiguous bf16 CPU tensor");
  TORCH_CHECK(t.sizes().vec() == shape, what, ": shape ", t.sizes(), " but expected ", c10::IntArrayRef(shape));
  return t;
}

// A projection's weight: bf16 [n, k], or a GGML type's uint8 [n, ggml_row_bytes(type, k)].
torch::Tensor checked_weight(const torch::Tensor& t, int64_t type, const char* what, int64_t n, int64_t k) {
  if (type == kBf16) return checked(t, what, {n, k});
  const int64_t rb = ggml_row_bytes(static_cast<int>(type), k);
  TORCH_CHECK(rb > 0, what, ": GGML type ", type, " has no kernel, or K=", k, " is not whole blocks of it");
  TORCH_CHECK(t.scalar_type() == torch::kUInt8 && t.is_contiguous() && t.device().is_cpu(), what,
              ": a GGML weight must be a contiguous uint8 CPU tensor");
  TORCH_CHECK(t.sizes().vec() == std::vector<int64_t>({n, rb}), what, ": shape ", t.sizes(), " but type ", type,
              " [", n, ", ", k, "] needs [", n, ", ", rb, "]");
  return t;
}

}  // namespace

FusedDecoder::FusedDecoder(torch::Tensor embed, int64_t embed_type, int64_t hidden, torch::Tensor final_norm,
                           torch::Tensor cos_table, torch::Tensor sin_table, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, int64_t intermediate, double eps, double scale, int64_t block_size)
    : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), intermediate_(intermediate),
      block_size_(block_size), eps_(static_cast<float>(eps)), scale_(static_cast<float>(scale)) {
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even for rotary");
  hidden_ = hidden;
  embed_type_ = static_cast<int>(embed_type);
  // bf16 [vocab, hidden], or a GGML type's blocks (layers/embedding.py), rows dequantized in embed().
  embed_ = checked_weight(embed, embed_type, "embed_tokens", embed.size(0), hidden_);
  final_norm_ = checked(final_norm, "norm", {hidden_});
  max_positions_ = cos_table.size(0);
  cos_ = checked(cos_table, "cos table", {max_positions_, head_dim / 2});
  sin_ = checked(sin_table, "sin table", {max_positions_, head_dim / 2});
}

// A merged projection's parts: one bf16 or GGML matrix of n rows, or GGML parts whose rows sum to n.
Projection checked_projection(const std::vector<torch::Tensor>& parts, const std::vector<int64_t>& types,
                              const char* what, int64_t n, int64_t k) {
  TORCH_CHECK(!parts.empty() && parts.size() == types.size(), what, ": ", parts.size(), " parts and ", types.size(),
              " types");
  Projection p;
  if (parts.size() == 1) {
    p.parts.push_back(checked_weight(parts[0], types[0], what, n, k));
    p.types.push_back(static_cast<int>(types[0]));
    return p;
  }
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    TORCH_CHECK(types[i] != kBf16, what, ": only GGML parts split a projection");
    p.parts.push_back(checked_weight(parts[i], types[i], what, parts[i].size(0), k));
    p.types.push_back(static_cast<int>(types[i]));
    rows += parts[i].size(0);
  }
  TORCH_CHECK(rows == n, what, ": parts of ", rows, " rows in all, expected ", n);
  return p;
}

void FusedDecoder::set_dense_mlp(DecoderLayerWeights& w, const std::optional<std::vector<torch::Tensor>>& gate_up,
                                 const std::optional<torch::Tensor>& down, const std::vector<int64_t>& gate_up_types,
                                 int64_t down_type) const {
  TORCH_CHECK(gate_up.has_value() == down.has_value(), "gate_up and down come together (neither: an MoE layer)");
  if (gate_up) {
    w.gate_up = checked_projection(*gate_up, gate_up_types, "gate_up_proj", 2 * intermediate_, hidden_);
    w.down = checked_weight(*down, down_type, "down_proj", hidden_, intermediate_);
  }
  w.down_type = static_cast<int>(down_type);
}

void FusedDecoder::add_layer(torch::Tensor input_norm, std::vector<torch::Tensor> qkv,
                             std::optional<torch::Tensor> qkv_bias, std::optional<torch::Tensor> q_norm,
                             std::optional<torch::Tensor> k_norm, torch::Tensor o_proj,
                             std::optional<torch::Tensor> o_bias, torch::Tensor post_norm,
                             std::optional<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> down,
                             torch::Tensor kv_cache, std::vector<int64_t> qkv_types, int64_t o_type,
                             std::vector<int64_t> gate_up_types, int64_t down_type) {
  const int64_t q = num_heads_ * head_dim_, kv = num_kv_heads_ * head_dim_, h = hidden_;
  TORCH_CHECK(layers_.empty() || !layers_[0].mla.defined(), "add_layer after add_mla_layer: one attention kind a model");
  DecoderLayerWeights w;
  w.input_norm = checked(input_norm, "input_layernorm", {h});
  w.qkv = checked_projection(qkv, qkv_types, "qkv_proj", q + 2 * kv, h);
  if (qkv_bias) w.qkv_bias = checked(*qkv_bias, "qkv_proj.bias", {q + 2 * kv});
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q_norm and k_norm come together");
  if (q_norm) {
    w.q_norm = checked(*q_norm, "q_norm", {head_dim_});
    w.k_norm = checked(*k_norm, "k_norm", {head_dim_});
  }
  w.o_proj = checked_weight(o_proj, o_type, "o_proj", h, q);
  if (o_bias) w.o_bias = checked(*o_bias, "o_proj.bias", {h});
  w.post_norm = checked(post_norm, "post_attention_layernorm", {h});
  set_dense_mlp(w, gate_up, down, gate_up_types, down_type);
  w.o_type = static_cast<int>(o_type);
  if (kv_cache.scalar_type() == torch::kInt8) {  // kernels/kv_quant.py: [2, blocks, Hkv, bs * (D + 4)]
    TORCH_CHECK(kv_cache.is_contiguous() && kv_cache.device().is_cpu(), "kv_cache: must be a contiguous CPU tensor");
    TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(0) == 2 && kv_cache.size(2) == num_kv_heads_ &&
                    kv_cache.size(3) == block_size_ * (head_dim_ + 4),
                "kv_cache: int8 shape ", kv_cache.sizes(), " but expected [2, blocks, ", num_kv_heads_, ", ",
                block_size_ * (head_dim_ + 4), "]");
    w.kv_cache = kv_cache;
  } else {
    w.kv_cache = checked(kv_cache, "kv_cache", {2, kv_cache.size(1), block_size_, num_kv_heads_, head_dim_});
  }
  TORCH_CHECK(layers_.empty() || layers_[0].kv_cache.scalar_type() == w.kv_cache.scalar_type(),
              "every layer's KV cache must have the same dtype");
  layers_.push_back(std::move(w));
}

void FusedDecoder::add_moe(torch::Tensor router, torch::Tensor w13, int64_t w13_type, torch::Tensor w2,
                           int64_t w2_type, int64_t top_k, bool renormalize,
                           std::optional<std::function<torch::Tensor(torch::Tensor, torch::Tensor)>> expert_slots) {
  TORCH_CHECK(!layers_.empty() && !layers_.back().gate_up.defined() && !layers_.back().moe(),
              "add_moe follows an add_layer given no gate_up and down");
  DecoderLayerWeights& w = layers_.back();
  const int64_t experts = router.size(0);
  w.router = checked(router, "mlp.gate", {experts, hidden_});
  // Streamed experts: the stacks are the cache's slots, as many as it holds, not one per expert.
  const int64_t rows = expert_slots ? w13.size(0) : experts;
  TORCH_CHECK(w13.dim() == 3 && w2.dim() == 3 && w13.size(0) == rows && w2.size(0) == rows,
              "experts: w13 and w2 must be [", rows, ", rows, cols]");
  TORCH_CHECK(top_k >= 1 && top_k <= experts, "top_k must be in 1..", experts);
  set_experts(w, w13, w13_type, w2, w2_type, top_k, renormalize);
  if (expert_slots) w.expert_slots = *expert_slots;
}

void FusedDecoder::add_mla_layer(torch::Tensor input_norm, std::optional<torch::Tensor> q_a, int64_t q_a_type,
                                 std::optional<torch::Tensor> q_a_norm, torch::Tensor q_b, int64_t q_b_type,
                                 torch::Tensor kv_a, int64_t kv_a_type, torch::Tensor kv_a_norm, torch::Tensor w_uk,
                                 torch::Tensor w_uv_t, torch::Tensor o_proj, int64_t o_type, torch::Tensor post_norm,
                                 std::optional<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> down,
                                 std::vector<int64_t> gate_up_types, int64_t down_type, torch::Tensor latent_cache,
                                 bool head_bmm) {
  TORCH_CHECK(layers_.empty() || layers_[0].mla.defined(), "add_mla_layer after add_layer: one attention kind a model");
  TORCH_CHECK(num_kv_heads_ == 1, "an MLA decoder is built with num_kv_heads 1 (every head attends the latent)");
  const int64_t h = hidden_, heads = num_heads_, rope = head_dim_;
  TORCH_CHECK(w_uk.dim() == 3 && w_uv_t.dim() == 3 && w_uk.size(0) == heads && w_uv_t.size(0) == heads,
              "w_uk [heads, nope, rank] and w_uv_t [heads, rank, v] for ", heads, " heads");
  const int64_t nope = w_uk.size(1), rank = w_uk.size(2), v = w_uv_t.size(2);
  DecoderLayerWeights w;
  MlaWeights& a = w.mla;
  a.rank = rank, a.rope = rope, a.nope = nope, a.v_dim = v;
  w.input_norm = checked(input_norm, "input_layernorm", {h});
  TORCH_CHECK(q_a.has_value() == q_a_norm.has_value(), "q_a_proj and q_a_layernorm come together");
  int64_t q_in = h;
  if (q_a) {
    q_in = q_a_norm->size(0);
    a.q_a = checked_projection({*q_a}, {q_a_type}, "q_a_proj", q_in, h);
    a.q_a_norm = checked(*q_a_norm, "q_a_layernorm", {q_in});
  }
  a.q_b = checked_projection({q_b}, {q_b_type}, q_a ? "q_b_proj" : "q_proj", heads * (nope + rope), q_in);
  a.kv_a = checked_projection({kv_a}, {kv_a_type}, "kv_a_proj_with_mqa", rank + rope, h);
  a.kv_a_norm = checked(kv_a_norm, "kv_a_layernorm", {rank});
  a.w_uk = checked(w_uk, "w_uk", {heads, nope, rank});
  a.w_uv_t = checked(w_uv_t, "w_uv_t", {heads, rank, v});
  a.head_bmm = head_bmm;
  w.o_proj = checked_weight(o_proj, o_type, "o_proj", h, heads * v);
  w.o_type = static_cast<int>(o_type);
  w.post_norm = checked(post_norm, "post_attention_layernorm", {h});
  set_dense_mlp(w, gate_up, down, gate_up_types, down_type);
  const bool int8_cache = latent_cache.scalar_type() == torch::kInt8;
  TORCH_CHECK((int8_cache || latent_cache.scalar_type() == torch::kBFloat16) && latent_cache.dim() == 3 &&
                  latent_cache.is_contiguous() && latent_cache.device().is_cpu() &&
                  latent_cache.size(1) == block_size_ && latent_cache.size(2) == rank + rope + (int8_cache ? 8 : 0),
              "latent cache: contiguous CPU [blocks, ", block_size_, ", ", rank + rope, "] bf16 or [.., ",
              rank + rope + 8, "] int8, got ", latent_cache.scalar_type(), " ", latent_cache.sizes());
  TORCH_CHECK(layers_.empty() || (layers_[0].mla.latent_cache.scalar_type() == latent_cache.scalar_type() &&
                                  layers_[0].mla.latent_cache.size(0) == latent_cache.size(0)),
              "every layer's latent cache must have the same dtype and blocks");
  a.latent_cache = latent_cache;
  layers_.push_back(std::move(w));
}

void FusedDecoder::add_grouped_moe(torch::Tensor router_f32, torch::Tensor correction_bias, torch::Tensor w13,
                                   int64_t w13_type, torch::Tensor w2, int64_t w2_type, int64_t top_k,
                                   bool renormalize, int64_t groups, int64_t topk_groups, double scaling,
                                   torch::Tensor shared_w13, int64_t shared_w13_type, torch::Tensor shared_w2,
                                   int64_t shared_w2_type,
                                   std::optional<std::function<torch::Tensor(torch::Tensor, torch::Tensor)>> expert_slots) {
  TORCH_CHECK(!layers_.empty() && !layers_.back().gate_up.defined() && !layers_.back().moe(),
              "add_grouped_moe follows a layer added with no gate_up and down");
  DecoderLayerWeights& w = layers_.back();
  const int64_t experts = router_f32.size(0);
  TORCH_CHECK(router_f32.scalar_type() == torch::kFloat32 && router_f32.is_contiguous() &&
                  router_f32.sizes().vec() == std::vector<int64_t>({experts, hidden_}),
              "router: contiguous float32 [experts, ", hidden_, "]");
  TORCH_CHECK(correction_bias.scalar_type() == torch::kFloat32 && correction_bias.is_contiguous() &&
                  correction_bias.numel() == experts,
              "correction bias: contiguous float32 [", experts, "]");
  const int64_t rows = expert_slots ? w13.size(0) : experts;  // an expert-parallel rank: its share
  TORCH_CHECK(w13.dim() == 3 && w2.dim() == 3 && w13.size(0) == rows && w2.size(0) == rows,
              "experts: w13 and w2 must be [", rows, ", rows, cols]");
  TORCH_CHECK(top_k >= 1 && top_k <= experts && groups >= 1 && experts % groups == 0 && topk_groups >= 1 &&
                  topk_groups <= groups,
              "routing: top_k ", top_k, ", groups ", groups, ", topk_groups ", topk_groups, " for ", experts,
              " experts");
  w.router_f32 = router_f32;
  w.correction_bias = correction_bias;
  set_experts(w, w13, w13_type, w2, w2_type, top_k, renormalize);
  if (expert_slots) w.expert_slots = *expert_slots;
  w.groups = groups;
  w.topk_groups = topk_groups;
  w.scaling = scaling;
  if (shared_w13.defined() && shared_w13.numel()) {
    w.shared_w13 = shared_w13;
    w.shared_w2 = shared_w2;
    w.shared_w13_type = static_cast<int>(shared_w13_type);
    w.shared_w2_type = static_cast<int>(shared_w2_type);
  }
}

int64_t FusedDecoder::num_blocks() const {
  return layers_[0].mla.defined() ? layers_[0].mla.latent_cache.size(0) : layers_[0].kv_cache.size(1);
}

void FusedDecoder::check_rows(const torch::Tensor& positions, const torch::Tensor& block_tables, int64_t m) const {
  TORCH_CHECK(positions.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kLong,
              "positions and block_tables must be int64");
  TORCH_CHECK(positions.is_contiguous() && block_tables.is_contiguous(), "positions and block_tables must be contiguous");
  // A data-parallel rank may bring no rows of its own (it still joins the MLPs' collectives).
  TORCH_CHECK(m >= (dp_total_ > 0 ? 0 : 1) && positions.size(0) == m && block_tables.dim() == 2 &&
                  block_tables.size(0) == m,
              "decode rows need matching positions and block tables");
  const int64_t width = block_tables.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  for (int64_t r = 0; r < m; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < max_positions_, "position ", pos[r], " beyond the rotary table");
    TORCH_CHECK((pos[r] + block_size_) / block_size_ <= width, "block table too narrow for position ", pos[r]);
    for (int64_t b = 0; b <= pos[r] / block_size_; ++b)
      TORCH_CHECK(tables[r * width + b] >= 0 && tables[r * width + b] < num_blocks(),
                  "block id ", tables[r * width + b], " outside the KV pool");
  }
}

torch::Tensor FusedDecoder::embed(torch::Tensor token_ids) const {
  TORCH_CHECK(token_ids.scalar_type() == torch::kLong && token_ids.dim() == 1 && token_ids.size(0) >= 1,
              "token_ids must be a non-empty 1-D int64 tensor");
  token_ids = token_ids.contiguous();
  const int64_t m = token_ids.size(0), h = hidden_;
  const int64_t* tok = token_ids.data_ptr<int64_t>();
  auto x = torch::empty({m, h}, torch::dtype(torch::kBFloat16));
  u16* out = reinterpret_cast<u16*>(x.data_ptr<at::BFloat16>());
  for (int64_t r = 0; r < m; ++r)
    TORCH_CHECK(tok[r] >= 0 && tok[r] < embed_.size(0), "token id ", tok[r], " out of range");
  if (embed_type_ != kBf16) {  // the looked-up rows dequantized as the whole table would be
    x.copy_(ggml_dequantize(embed_.index_select(0, token_ids), embed_type_, h));
    return x;
  }
  const u16* table = bf16_ptr(embed_);
  for (int64_t r = 0; r < m; ++r) std::memcpy(out + r * h, table + tok[r] * h, h * sizeof(u16));
  return x;
}

void FusedDecoder::run_layers(torch::Tensor x, torch::Tensor positions, torch::Tensor block_tables, int64_t begin,
                              int64_t end) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.size(1) == hidden_ && x.is_contiguous(),
              "x must be a contiguous [rows, hidden] bf16 tensor from embed()");
  TORCH_CHECK(0 <= begin && begin <= end && end <= num_layers(), "layer range [", begin, ", ", end, ") outside [0, ",
              num_layers(), ")");
  const GgmlActivations activations(int8_activations_);  // what the GGML GEMVs below read
  const int m = static_cast<int>(x.size(0));
  check_rows(positions, block_tables, m);
  const int64_t h = hidden_, d = head_dim_, hq = num_heads_, hkv = num_kv_heads_, inter = intermediate_;
  int64_t experts = 0, widest = 0, attn_width = hq * d;  // f32's row: the widest projection output
  for (int64_t l = begin; l < end; ++l) {
    const DecoderLayerWeights& w = layers_[l];
    TORCH_CHECK(w.moe() || w.gate_up.defined(), "layer ", l, " has no MLP (add_moe missing)");
    if (w.moe()) experts = std::max(experts, w.router_f32.defined() ? w.router_f32.size(0) : w.router.size(0));
    if (w.mla.defined()) {
      const MlaWeights& a = w.mla;
      widest = std::max({widest, hq * (a.nope + a.rope), a.rank + a.rope, a.q_a.defined() ? a.q_a_norm.size(0) : 0});
      attn_width = std::max(attn_width, hq * a.v_dim);
    }
  }
  const int64_t qkv_n = (hq + 2 * hkv) * d, width = block_tables.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  u16* xs = reinterpret_cast<u16*>(x.data_ptr<at::BFloat16>());
  // Data-parallel attention: the MLPs run on every rank's `big` rows, this rank's at dp_offset_.
  const bool dp = dp_total_ > 0;
  TORCH_CHECK(!dp || (all_reduce_ && dp_offset_ >= 0 && dp_offset_ + m <= dp_total_),
              "data-parallel rows: ", m, " rows at ", dp_offset_, " of ", dp_total_, " (and an all-reduce) expected");
  const int64_t big = dp ? dp_total_ : m;

  std::vector<u16> normed(big * h), qkv(m * qkv_n), attn(m * attn_width), act(big * inter), mla_scratch;
  std::vector<float> f32(big * std::max({qkv_n, 2 * inter, h, experts, widest}));
  const u16* cos = bf16_ptr(cos_);
  const u16* sin = bf16_ptr(sin_);
  const MlaStep mla_step{pos, positions, block_tables, cos, sin, hq, block_size_, eps_, scale_};

  PhaseClock clock(&phase_s_, phase_timing_);
  for (int64_t l = begin; l < end; ++l) {
    const DecoderLayerWeights& w = layers_[l];
    for (int r = 0; r < m; ++r) rms_norm(xs + r * h, bf16_ptr(w.input_norm), normed.data() + r * h, h, eps_);
    clock.mark(l, kPhaseNorm);
    if (m == 0) {
      // A data-parallel rank with no requests this step: no attention, only the MLP's collectives.
    } else if (w.mla.defined()) {
      mla_attention(w.mla, mla_step, normed.data(), f32.data(), mla_scratch, attn.data(), m, clock, l);
    } else {
      const u16* qkv_bias = bf16_ptr(project(w.qkv, w.qkv_bias, normed.data(), f32.data(), m));
      clock.mark(l, kPhaseGemm);
      const bool int8_kv = w.kv_cache.scalar_type() == torch::kInt8;
      const int64_t cache_half = w.kv_cache.numel() / 2;
      // Rounding the qkv output, q/k norms, rotary and the KV write count as attention: the per-head
      // work that feeds it (O(heads * head_dim) a row against the GEMV's O(hidden * qkv width)).
      for (int r = 0; r < m; ++r) {
        u16* x = qkv.data() + r * qkv_n;
        round_out(f32.data() + r * qkv_n, qkv_bias, x, qkv_n);
        for (int64_t head = 0; head < hq + hkv; ++head) {
          u16* v = x + head * d;
          if (w.q_norm.defined()) rms_norm(v, bf16_ptr(head < hq ? w.q_norm : w.k_norm), v, d, eps_);
          rotate_neox(v, cos + pos[r] * (d / 2), sin + pos[r] * (d / 2), d / 2);
        }
        const int64_t slot = tables[r * width + pos[r] / block_size_] * block_size_ + pos[r] % block_size_;
        if (int8_kv) {  // per (block, head): block_size rows of d values, then block_size fp32 scales
          int8_t* cache = w.kv_cache.data_ptr<int8_t>();
          const int64_t run = block_size_ * (d + 4), block = slot / block_size_, s = slot % block_size_;
          for (int64_t g = 0; g < hkv; ++g)
            for (int half = 0; half < 2; ++half) {
              int8_t* base = cache + half * cache_half + (block * hkv + g) * run;
              quantize_kv_row(x + (hq + half * hkv + g) * d, d, base + s * d,
                              reinterpret_cast<float*>(base + block_size_ * d + s * 4), half == 0);
            }
        } else {
          u16* cache = reinterpret_cast<u16*>(w.kv_cache.data_ptr<at::BFloat16>());
          std::memcpy(cache + slot * hkv * d, x + hq * d, hkv * d * sizeof(u16));
          std::memcpy(cache + cache_half + slot * hkv * d, x + (hq + hkv) * d, hkv * d * sizeof(u16));
        }
      }
      if (int8_kv) {
        const int8_t* cache = w.kv_cache.data_ptr<int8_t>();
        const PagedKVInt8 paged{cache, cache + cache_half, block_size_, hkv, d};
        decode_attention_int8(qkv.data(), qkv_n, pos, tables, width, paged, hq, scale_, attn.data(), m);
      } else {
        const u16* cache = reinterpret_cast<const u16*>(w.kv_cache.data_ptr<at::BFloat16>());
        const PagedKV paged{cache, cache + cache_half, block_size_, hkv, d};
        decode_attention(qkv.data(), qkv_n, pos, tables, width, paged, hq, scale_, attn.data(), m);
      }
      clock.mark(l, kPhaseAttention);
    }
    if (m > 0) {
      // Under tensor parallelism the bias is added once, after the ranks' partial sums are (under
      // data-parallel attention the projection is whole: nothing to sum).
      const bool split = all_reduce_ && !dp;
      const torch::Tensor& o_bias_in = split ? torch::Tensor() : w.o_bias;
      const u16* o_bias = bf16_ptr(project(w.o_proj, w.o_type, o_bias_in, attn.data(), f32.data(), m));
      clock.mark(l, kPhaseGemm);
      if (split) {
        reduce(f32.data(), m * h, 2 * l);
        clock.skip();
        o_bias = bf16_ptr(w.o_bias);
      }
      // The residual add goes with the norm after it: both one elementwise pass over x.
      for (int r = 0; r < m; ++r) residual_add(xs + r * h, f32.data() + r * h, o_bias, h);
      for (int r = 0; r < m; ++r) rms_norm(xs + r * h, bf16_ptr(w.post_norm), normed.data() + r * h, h, eps_);
      clock.mark(l, kPhaseNorm);
    }
    if (dp) {
      // Every rank's normed rows, gathered: each rank writes its own rows, zeros elsewhere, and the
      // sum is exact. The MLP input is the rounded bf16 it was on its own rank.
      std::fill(f32.begin(), f32.begin() + big * h, 0.0f);
      for (int64_t i = 0; i < m * h; ++i) f32[dp_offset_ * h + i] = bf16_to_float(normed[i]);
      reduce(f32.data(), big * h, 2 * l);
      clock.skip();
      for (int64_t i = 0; i < big * h; ++i) normed[i] = float_to_bf16(f32[i]);
    }
    if (w.moe()) {
      auto [weights, ids] = w.router_f32.defined() ? grouped_moe_route(w, normed.data(), big)
                                                   : moe_mlp_route(w, normed.data(), f32.data(), big);
      clock.mark(l, kPhaseMoeRouting);
      moe_mlp_experts(w, normed.data(), weights, ids, f32.data(), big);
      clock.mark(l, kPhaseExperts);
    } else {
      // silu(gate) * up counts as GEMM: the epilogue between the two GEMVs (O(intermediate) a row).
      project(w.gate_up, torch::Tensor(), normed.data(), f32.data(), big);
      for (int r = 0; r < big; ++r) {
        const float* gate_up = f32.data() + r * 2 * inter;
        silu_mul(gate_up, gate_up + inter, act.data() + r * inter, inter);
      }
      project(w.down, w.down_type, torch::Tensor(), act.data(), f32.data(), big);
      clock.mark(l, kPhaseGemm);
    }
    if (all_reduce_) {
      reduce(f32.data(), big * h, 2 * l + 1);
      clock.skip();
    }
    // The MLP's residual add goes with the MLP that produced it (its output's epilogue); under
    // data-parallel attention this rank's rows of the summed output.
    const float* mine = f32.data() + (dp ? dp_offset_ * h : 0);
    for (int r = 0; r < m; ++r) residual_add(xs + r * h, mine + r * h, nullptr, h);
    clock.mark(l, w.moe() ? kPhaseExperts : kPhaseGemm);
  }
}

void FusedDecoder::set_phase_timing(bool on) {
  phase_timing_ = on;
  phase_s_.assign(on ? kNumPhases * layers_.size() : 0, 0.0);
}

std::vector<std::string> FusedDecoder::phase_names() {
  return {"norm", "gemm", "attention", "moe_routing", "experts"};  // DecodePhase order
}

void FusedDecoder::set_all_reduce(int64_t fn, int64_t ctx) {
  TORCH_CHECK(fn != 0, "set_all_reduce: no function");
  all_reduce_ = reinterpret_cast<AllReduceFn>(fn);
  all_reduce_ctx_ = reinterpret_cast<void*>(ctx);
  layer_reduce_s_.assign(2 * layers_.size(), 0.0);
}

void FusedDecoder::set_data_parallel_rows(int64_t offset, int64_t total) {
  TORCH_CHECK(offset >= 0 && total >= 0 && offset <= total, "set_data_parallel_rows: offset ", offset, " of ", total);
  dp_offset_ = offset;
  dp_total_ = total;
}

double FusedDecoder::all_reduce_seconds() const {
  double total = 0.0;
  for (double s : layer_reduce_s_) total += s;
  return total;
}

void FusedDecoder::reduce(float* data, int64_t numel, int64_t slot) {
  char err[256] = {0};
  constexpr int kFloat32 = 0;  // tacit_shm_all_reduce's dtype code for float32
  const auto start = std::chrono::steady_clock::now();
  const int rc = all_reduce_(all_reduce_ctx_, data, numel, kFloat32, err, sizeof(err));
  layer_reduce_s_[slot] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  TORCH_CHECK(rc == 0, err);
}

torch::Tensor FusedDecoder::final_norm(torch::Tensor x) const {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.size(1) == hidden_ && x.is_contiguous(),
              "x must be a contiguous [rows, hidden] bf16 tensor from embed()");
  const int64_t m = x.size(0), h = hidden_;
  auto out = torch::empty({m, h}, torch::dtype(torch::kBFloat16));
  const u16* xs = reinterpret_cast<const u16*>(x.data_ptr<at::BFloat16>());
  u16* o = reinterpret_cast<u16*>(out.data_ptr<at::BFloat16>());
  for (int64_t r = 0; r < m; ++r) rms_norm(xs + r * h, bf16_ptr(final_norm_), o + r * h, h, eps_);
  return out;
}

torch::Tensor FusedDecoder::forward(torch::Tensor token_ids, torch::Tensor positions, torch::Tensor block_tables) {
  torch::Tensor x = embed(token_ids);
  run_layers(x, positions.contiguous(), block_tables.contiguous(), 0, num_layers());
  return final_norm(x);
}

}  // namespace tacit
