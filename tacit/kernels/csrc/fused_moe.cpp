// A sparse MoE layer's routing and experts in two calls, for bf16 activations on x86 CPUs.
//
// Why: the torch kernel (kernels/torch_moe.py) runs a Python loop over the experts that got
// tokens, five ops each; at batch 1 that is 8 experts x ~6 ops of 5-20 us dispatch around
// GEMVs of 2 x 384 x 1024 and 1024 x 384 (1.6 MB of bf16 each expert) — dispatch, not the
// weights, sets the time. Here:
//
// moe_route: softmax (Qwen3-MoE, Mixtral) or sigmoid with the correction bias and group-limited
//   selection (DeepSeek-V3, Kimi-K2), top-k and the weights, in fp32, one pass per token row.
//   Expert selection repeats torch.topk's own selection (ATen/native/TopKImpl.h: the same
//   comparator over the same (value, index) pairs, then std::nth_element or std::partial_sort),
//   so exact ties — common with bf16 router logits: 34 of 800 random rows of 128 experts — go
//   to the same experts as in the torch reference, not merely to equally good ones.
//
// moe_experts: a counting sort puts token slots into per-expert lists, then
//   phase 1, parallel over (expert, block of <= 8 slots, 64-row chunk of the intermediate):
//     gate and up rows of that chunk, SiLU(gate) * up in the epilogue -> act [slots, I] bf16;
//   phase 2, parallel over (expert, 256-row run of its down matrix): the run times its slots'
//     act rows, added with the routing weight into the thread's own fp32 accumulator; the
//     threads' accumulators are then summed in thread order. (32-row chunks of every expert in
//     turn, the first layout, made each stream 24 KB long: 15.6-17.2 GB/s against 18.3-21.8 for
//     16 tokens over random:qwen3-moe-2b-shaped experts, three alternating runs.)
//   Each active expert's weights are read once a step for up to 8 of its tokens, and no
//   [tokens x top_k, hidden] permuted copy exists.
//   An expert with more than kLargeRows slots (prefill) instead runs as two oneDNN GEMMs on its
//   gathered rows before phase 2: past ~16 rows the GEMV tile re-reads its weights from cache
//   and the AMX GEMM is faster.
//   gpt-oss's experts add a bias to each gate/up row and each down row, in the same epilogues,
//   and join gate and up with their clamped SwiGLU (swiglu_oai_mul) instead of silu_mul.
//   The shared expert (DeepSeek) is one more expert that every token uses with weight 1; its
//   output is added after the routed sum is rounded, as `routed + shared_experts(x)` does.
//
// Numerics follow the torch kernel's bf16 path at each rounding point (GEMV outputs, silu,
// silu * up, the routing weight in bf16), except that the routed sum is accumulated in fp32
// and rounded once where index_add_ rounds after every expert.
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "bf16_common.h"
#include "bf16_vec.h"
#include "fused_moe.h"
#include "ggml_gemv.h"

namespace tacit {
namespace {

using u16 = uint16_t;
using Elem = std::pair<float, int64_t>;

constexpr int64_t kLargeRows = 16;  // an expert with more slots runs as oneDNN GEMMs
constexpr int64_t kInterChunk = 64;  // phase-1 rows of gate (and of up) per work item
constexpr int64_t kDownRows = 256;  // phase-2 rows of one expert's down per work item

// torch.topk's comparator for largest=True: NaN first, then by value.
inline bool topk_before(const Elem& x, const Elem& y) {
  return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
}

// torch.topk's CPU selection (TopKImpl.h), so ties fall where they fall in torch.
void torch_topk(std::vector<Elem>& q, int64_t k, bool sorted) {
  if (k * 64 <= static_cast<int64_t>(q.size())) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), topk_before);
  } else {
    std::nth_element(q.begin(), q.begin() + k - 1, q.end(), topk_before);
    if (sorted) std::sort(q.begin(), q.begin() + k - 1, topk_before);
  }
}

void route_softmax(const float* logits, int64_t e, int64_t k, bool renormalize, float* weights, int64_t* ids,
                   std::vector<Elem>& q) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < e; ++i) mx = std::max(mx, logits[i]);
  float total = 0.f;
  for (int64_t i = 0; i < e; ++i) total += std::exp(logits[i] - mx);
  // softmax is monotonic, so the top-k of the logits is the top-k of the probabilities.
  for (int64_t i = 0; i < e; ++i) q[i] = {logits[i], i};
  torch_topk(q, k, /*sorted=*/true);
  float kept = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    weights[j] = std::exp(q[j].first - mx) / total;
    ids[j] = q[j].second;
    kept += weights[j];
  }
  if (renormalize)
    for (int64_t j = 0; j < k; ++j) weights[j] /= kept;
}

void route_grouped_sigmoid(const float* logits, const float* bias, int64_t e, int64_t k, int64_t groups,
                           int64_t topk_groups, bool renormalize, float scaling, float* weights, int64_t* ids,
                           std::vector<Elem>& q, std::vector<float>& scores) {
  const int64_t per = e / groups;
  for (int64_t i = 0; i < e; ++i) scores[i] = 1.f / (1.f + std::exp(-logits[i]));
  // Each group scores as the sum of its two best biased scores.
  std::vector<Elem> in_group(per), group_scores(groups);
  const int64_t best = std::min<int64_t>(2, per);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < per; ++i) in_group[i] = {scores[g * per + i] + bias[g * per + i], i};
    torch_topk(in_group, best, /*sorted=*/true);
    float s = 0.f;
    for (int64_t j = 0; j < best; ++j) s += in_group[j].first;
    group_scores[g] = {s, g};
  }
  torch_topk(group_scores, topk_groups, /*sorted=*/false);
  std::vector<char> allowed(groups, 0);
  for (int64_t j = 0; j < topk_groups; ++j) allowed[group_scores[j].second] = 1;
  for (int64_t i = 0; i < e; ++i)
    q[i] = {allowed[i / per] ? scores[i] + bias[i] : -std::numeric_limits<float>::infinity(), i};
  torch_topk(q, k, /*sorted=*/false);
  float kept = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = q[j].second;
    weights[j] = scores[ids[j]];
    kept += weights[j];
  }
  for (int64_t j = 0; j < k; ++j) weights[j] = (renormalize ? weights[j] / (kept + 1e-20f) : weights[j]) * scaling;
}

// gpt-oss's activation from fp32 gate/up GEMV outputs (their biases already added), rounded to
// bf16 where the torch kernel's bf16 ops round (kernels/torch_moe.py gate_activation):
// g = min(round(gate), limit), u = clamp(round(up), -limit, limit),
// act = round(round(u + 1) * round(g * round(sigmoid(round(g * alpha))))).
inline void swiglu_oai_mul(const float* gate, const float* up, uint16_t* act, int64_t n, float alpha, float limit) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f), lim = _mm512_set1_ps(limit), neg = _mm512_set1_ps(-limit);
  const __m512 a = _mm512_set1_ps(alpha);
  for (; i + 16 <= n; i += 16) {
    // min/max return their second operand when one is NaN: the value goes second, so a NaN
    // passes through as torch.clamp passes it.
    const __m512 g = _mm512_min_ps(lim, round16(_mm512_loadu_ps(gate + i)));
    const __m512 u = _mm512_max_ps(neg, _mm512_min_ps(lim, round16(_mm512_loadu_ps(up + i))));
    const __m512 ga = round16(_mm512_mul_ps(g, a));
    const __m512 s = round16(_mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), ga)))));
    const __m512 glu = round16(_mm512_mul_ps(g, s));
    store16(act + i, _mm512_mul_ps(round16(_mm512_add_ps(u, one)), glu));
  }
  for (; i < n; ++i) {
    const float g0 = round_bf16(gate[i]), u0 = round_bf16(up[i]);
    const float g = std::isnan(g0) ? g0 : std::min(g0, limit);
    const float u = std::isnan(u0) ? u0 : std::max(-limit, std::min(u0, limit));
    const float s = round_bf16(1.0f / (1.0f + exp1(-round_bf16(g * alpha))));
    act[i] = float_to_bf16(round_bf16(u + 1.0f) * round_bf16(g * s));
  }
}

// y[j] += bias[j] for the n fp32 outputs of one row (bias bf16), before their first rounding:
// F.linear with a bias rounds x w^T + b once.
inline void add_bias(float* y, const uint16_t* bias, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += bf16_to_float(bias[j]);
}

// One expert set's matrices: w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I], each
// bf16 or a GGML type's uint8 blocks (ggml_gemv.h); optional bf16 biases b13 [E, 2I], b2 [E, H].
struct Experts {
  const uint8_t* w13;
  const uint8_t* w2;
  int t13, t2;
  int64_t row13, row2;  // bytes per row
  int64_t hidden, inter;
  const int64_t* slot = nullptr;  // expert id -> row of the stacks (a streamed expert cache), or none
  const u16* b13 = nullptr;
  const u16* b2 = nullptr;
  int64_t activation = kActSilu;
  float alpha = 0.f, limit = 0.f;
  int64_t row_of(int64_t e) const { return slot ? slot[e] : e; }
  const uint8_t* gate_up(int64_t e) const { return w13 + row_of(e) * 2 * inter * row13; }
  const uint8_t* down(int64_t e) const { return w2 + row_of(e) * hidden * row2; }
  const u16* gate_up_bias(int64_t e) const { return b13 ? b13 + row_of(e) * 2 * inter : nullptr; }
  const u16* down_bias(int64_t e) const { return b2 ? b2 + row_of(e) * hidden : nullptr; }
  // act[n] from one row's fp32 gate and up outputs (chunk c of the intermediate), biases added.
  void activate(int64_t e, int64_t c, float* g, float* u, u16* act, int64_t n) const {
    if (const u16* b = gate_up_bias(e)) {
      add_bias(g, b + c, n);
      add_bias(u, b + inter + c, n);
    }
    if (activation == kActSwigluOai)
      swiglu_oai_mul(g, u, act, n, alpha, limit);
    else
      silu_mul(g, u, act, n);
  }
};

int64_t row_bytes(int type, int64_t k) { return type == kBf16 ? 2 * k : ggml_row_bytes(type, k); }

Experts experts_of(const torch::Tensor& w13, int64_t t13, const torch::Tensor& w2, int64_t t2, int64_t hidden,
                   int64_t inter, const char* what) {
  for (const auto* t : {&w13, &w2}) {
    TORCH_CHECK(t->is_contiguous() && t->dim() == 3, what, ": expert weights must be contiguous [E, rows, cols]");
  }
  const auto check = [&](const torch::Tensor& w, int64_t type, int64_t rows, int64_t k) {
    if (type == kBf16) {
      TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.size(1) == rows && w.size(2) == k, what,
                  ": bf16 experts must be [E, ", rows, ", ", k, "]");
    } else {
      const int64_t rb = ggml_row_bytes(static_cast<int>(type), k);
      TORCH_CHECK(rb > 0, what, ": GGML type ", type, " has no kernel for rows of ", k);
      TORCH_CHECK(w.scalar_type() == torch::kUInt8 && w.size(1) == rows && w.size(2) == rb, what,
                  ": GGML experts must be uint8 [E, ", rows, ", ", rb, "]");
    }
  };
  check(w13, t13, 2 * inter, hidden);
  check(w2, t2, hidden, inter);
  TORCH_CHECK(w13.size(0) == w2.size(0), what, ": w13 and w2 have different expert counts");
  return Experts{static_cast<const uint8_t*>(w13.data_ptr()),
                 static_cast<const uint8_t*>(w2.data_ptr()),
                 static_cast<int>(t13),
                 static_cast<int>(t2),
                 row_bytes(static_cast<int>(t13), hidden),
                 row_bytes(static_cast<int>(t2), inter),
                 hidden,
                 inter};
}

void gemv_rows(const uint8_t* w, int type, const u16* x, float* y, int64_t n, int64_t k, int m, bool int8) {
  if (type == kBf16)
    gemv_bf16_rows(reinterpret_cast<const u16*>(w), x, y, n, 0, n, k, m);
  else
    gemv_ggml_rows(w, type, x, y, n, 0, n, k, m, int8);
}

// One expert's [rows, k] matrix as a bf16 tensor for oneDNN (GGML blocks dequantized, as the
// GGML linear method does for prefill).
torch::Tensor dense_matrix(const uint8_t* w, int type, int64_t rows, int64_t k) {
  if (type == kBf16)
    return torch::from_blob(const_cast<uint8_t*>(w), {rows, k}, torch::dtype(torch::kBFloat16));
  auto blocks = torch::from_blob(const_cast<uint8_t*>(w), {rows, ggml_row_bytes(type, k)}, torch::dtype(torch::kUInt8));
  return ggml_dequantize(blocks, type, k);
}

// A run of slots of one expert set's expert: slots [begin, begin + count) of the sorted order.
struct Segment {
  const Experts* set;
  int64_t expert, begin, count;
  u16* act;  // [count, inter] rows of this set's act buffer
};

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> moe_route(torch::Tensor logits, std::optional<torch::Tensor> bias,
                                                   int64_t top_k, bool sigmoid, bool renormalize, int64_t groups,
                                                   int64_t topk_groups, double scaling) {
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 && logits.is_contiguous(),
              "router logits must be contiguous float32 [tokens, experts]");
  const int64_t t = logits.size(0), e = logits.size(1);
  TORCH_CHECK(top_k >= 1 && top_k <= e, "top_k must be in 1..", e);
  if (sigmoid) {
    TORCH_CHECK(bias.has_value() && bias->scalar_type() == torch::kFloat32 && bias->numel() == e &&
                    bias->is_contiguous(),
                "sigmoid routing needs a float32 correction bias of ", e, " values");
    TORCH_CHECK(groups >= 1 && e % groups == 0 && topk_groups >= 1 && topk_groups <= groups, "expert groups");
  }
  auto weights = torch::empty({t, top_k}, torch::dtype(torch::kFloat32));
  auto ids = torch::empty({t, top_k}, torch::dtype(torch::kInt64));
  const float* l = logits.data_ptr<float>();
  const float* b = sigmoid ? bias->data_ptr<float>() : nullptr;
  float* w = weights.data_ptr<float>();
  int64_t* id = ids.data_ptr<int64_t>();
  at::parallel_for(0, t, 16, [&](int64_t begin, int64_t end) {
    std::vector<Elem> q(e);
    std::vector<float> scores(e);
    for (int64_t r = begin; r < end; ++r) {
      if (sigmoid)
        route_grouped_sigmoid(l + r * e, b, e, top_k, groups, topk_groups, renormalize, static_cast<float>(scaling),
                              w + r * top_k, id + r * top_k, q, scores);
      else
        route_softmax(l + r * e, e, top_k, renormalize, w + r * top_k, id + r * top_k, q);
    }
  });
  return {weights, ids};
}

torch::Tensor moe_experts(torch::Tensor x, torch::Tensor topk_weights, torch::Tensor topk_ids, torch::Tensor w13,
                          int64_t w13_type, torch::Tensor w2, int64_t w2_type, std::optional<torch::Tensor> shared_w13,
                          int64_t shared_w13_type, std::optional<torch::Tensor> shared_w2, int64_t shared_w2_type,
                          std::optional<torch::Tensor> expert_slots, std::optional<torch::Tensor> w13_bias,
                          std::optional<torch::Tensor> w2_bias, int64_t activation, double alpha, double limit) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(), "x: contiguous bf16 [T, H]");
  TORCH_CHECK(topk_ids.scalar_type() == torch::kInt64 && topk_ids.dim() == 2 && topk_ids.size(0) == x.size(0),
              "topk_ids: int64 [T, K]");
  TORCH_CHECK(topk_weights.sizes() == topk_ids.sizes(), "topk_weights must match topk_ids");
  const int64_t t = x.size(0), h = x.size(1), k = topk_ids.size(1);
  TORCH_CHECK(w13.dim() == 3, "w13: [E, 2 * I, cols]");
  const int64_t inter = w13.size(1) / 2;
  Experts routed = experts_of(w13, w13_type, w2, w2_type, h, inter, "routed experts");
  TORCH_CHECK(activation == kActSilu || activation == kActSwigluOai, "expert activation ", activation,
              " is not one of 0 (silu), 1 (swigluoai)");
  routed.activation = activation;
  routed.alpha = static_cast<float>(alpha);
  routed.limit = static_cast<float>(limit);
  const auto bias_of = [&](const std::optional<torch::Tensor>& b, int64_t cols, const char* name) -> const u16* {
    if (!b.has_value()) return nullptr;
    TORCH_CHECK(b->scalar_type() == torch::kBFloat16 && b->is_contiguous() && b->dim() == 2 &&
                    b->size(0) == w13.size(0) && b->size(1) == cols,
                name, ": contiguous bf16 [", w13.size(0), ", ", cols, "]");
    return reinterpret_cast<const u16*>(b->data_ptr<at::BFloat16>());
  };
  routed.b13 = bias_of(w13_bias, 2 * inter, "w13_bias");
  routed.b2 = bias_of(w2_bias, h, "w2_bias");
  int64_t num_experts = w13.size(0);
  torch::Tensor slots_c;
  if (expert_slots.has_value()) {  // ids index the slot table, the table indexes the stacks
    slots_c = expert_slots->to(torch::kInt64).contiguous();
    num_experts = slots_c.numel();
    routed.slot = slots_c.data_ptr<int64_t>();
  }
  std::optional<Experts> shared;
  if (shared_w13.has_value()) {
    TORCH_CHECK(shared_w2.has_value() && shared_w13->size(0) == 1, "shared expert: w13 and w2 as [1, rows, cols]");
    shared = experts_of(*shared_w13, shared_w13_type, *shared_w2, shared_w2_type, h, shared_w13->size(1) / 2,
                        "shared expert");
  }
  auto ids_c = topk_ids.contiguous();
  auto weights_c = topk_weights.to(torch::kFloat32).contiguous();
  const int64_t* ids = ids_c.data_ptr<int64_t>();
  const float* wts = weights_c.data_ptr<float>();

  // Counting sort of the T * K slots by expert, stable in token order (the torch kernel's order).
  const int64_t slots = t * k;
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t s = 0; s < slots; ++s) {
    TORCH_CHECK(ids[s] >= 0 && ids[s] < num_experts, "expert id ", ids[s], " out of range 0..", num_experts - 1);
    ++start[ids[s] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) start[e + 1] += start[e];
  std::vector<int64_t> token(slots + (shared ? t : 0));
  std::vector<float> weight(token.size());
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t at = fill[ids[s]]++;
      token[at] = s / k;
      weight[at] = round_bf16(wts[s]);  // the torch kernel multiplies by the weight in bf16
    }
  }
  for (int64_t i = 0; shared && i < t; ++i) token[slots + i] = i, weight[slots + i] = 1.f;

  auto act = torch::empty({slots, inter}, torch::dtype(torch::kBFloat16));
  auto act_shared = torch::empty({shared ? t : 0, shared ? shared->inter : 0}, torch::dtype(torch::kBFloat16));
  u16* act_r = reinterpret_cast<u16*>(act.data_ptr<at::BFloat16>());
  u16* act_s = reinterpret_cast<u16*>(act_shared.data_ptr<at::BFloat16>());
  std::vector<Segment> segments;
  // A slot of -1: another expert-parallel rank holds the expert; its rows here stay zero.
  for (int64_t e = 0; e < num_experts; ++e)
    if (start[e + 1] > start[e] && routed.row_of(e) != -1) {
      TORCH_CHECK(routed.row_of(e) >= 0 && routed.row_of(e) < w13.size(0), "expert ", e, " has no slot in the stacks");
      segments.push_back({&routed, e, start[e], start[e + 1] - start[e], act_r + start[e] * inter});
    }
  if (shared) segments.push_back({&*shared, 0, slots, t, act_s});

  // Large segments: oneDNN GEMMs on the gathered rows, their outputs kept for phase 2.
  const u16* xp = reinterpret_cast<const u16*>(x.data_ptr<at::BFloat16>());
  std::vector<torch::Tensor> large_out(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& sg = segments[i];
    if (sg.count <= kLargeRows) continue;
    const Experts& ex = *sg.set;
    auto idx = torch::from_blob(token.data() + sg.begin, {sg.count}, torch::dtype(torch::kInt64));
    const auto bias = [](const u16* b, int64_t n) -> std::optional<torch::Tensor> {
      if (!b) return std::nullopt;
      return torch::from_blob(const_cast<u16*>(b), {n}, torch::dtype(torch::kBFloat16));
    };
    auto gate_up = torch::linear(x.index_select(0, idx), dense_matrix(ex.gate_up(sg.expert), ex.t13, 2 * ex.inter, h),
                                 bias(ex.gate_up_bias(sg.expert), 2 * ex.inter));
    auto parts = gate_up.chunk(2, 1);
    torch::Tensor act_rows;
    if (ex.activation == kActSwigluOai) {  // kernels/torch_moe.py gate_activation, op for op
      auto g = parts[0].clamp_max(ex.limit), u = parts[1].clamp(-ex.limit, ex.limit);
      act_rows = (u + 1) * (g * torch::sigmoid(g * ex.alpha));
    } else {
      act_rows = torch::silu(parts[0]) * parts[1];
    }
    large_out[i] = torch::linear(act_rows, dense_matrix(ex.down(sg.expert), ex.t2, h, ex.inter),
                                 bias(ex.down_bias(sg.expert), h));
  }

  // Phase 1: (segment, block of <= 8 slots, chunk of the intermediate) -> act.
  struct Item {
    int32_t segment;
    int64_t first;  // slot offset within the segment
    int32_t rows;
    int64_t chunk;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].count > kLargeRows) continue;
    for (int64_t f = 0; f < segments[i].count; f += kMaxSkinnyRows)
      for (int64_t c = 0; c < segments[i].set->inter; c += kInterChunk)
        items.push_back({static_cast<int32_t>(i), f,
                         static_cast<int32_t>(std::min<int64_t>(kMaxSkinnyRows, segments[i].count - f)), c});
  }
  const int threads = std::max(1, at::get_num_threads());
  const bool int8 = ggml_int8_activations();  // the caller's choice, read before the workers start
#pragma omp parallel num_threads(threads)
  {
    std::vector<u16> xs(kMaxSkinnyRows * h);
    std::vector<float> gate(kMaxSkinnyRows * kInterChunk), up(kMaxSkinnyRows * kInterChunk);
#pragma omp for schedule(static)
    for (size_t it = 0; it < items.size(); ++it) {
      const Item& item = items[it];
      const Segment& sg = segments[item.segment];
      const Experts& ex = *sg.set;
      const int m = item.rows;
      const int64_t* tok = token.data() + sg.begin + item.first;
      const u16* rows = xp + tok[0] * h;
      if (m > 1) {
        for (int r = 0; r < m; ++r) std::memcpy(xs.data() + r * h, xp + tok[r] * h, h * sizeof(u16));
        rows = xs.data();
      }
      const int64_t n = std::min(kInterChunk, ex.inter - item.chunk);
      const uint8_t* w = ex.gate_up(sg.expert);
      gemv_rows(w + item.chunk * ex.row13, ex.t13, rows, gate.data(), n, h, m, int8);
      gemv_rows(w + (ex.inter + item.chunk) * ex.row13, ex.t13, rows, up.data(), n, h, m, int8);
      for (int r = 0; r < m; ++r)
        ex.activate(sg.expert, item.chunk, gate.data() + r * n, up.data() + r * n,
                    sg.act + (item.first + r) * ex.inter + item.chunk, n);
    }
  }

  // Phase 2: (segment, kDownRows rows of its down matrix) items, so each item streams one
  // contiguous run of one expert (192 KB for a 384-wide bf16 expert) rather than 32 rows of
  // every expert in turn; each thread adds its items into its own fp32 accumulator, and the
  // accumulators are summed in thread order (deterministic for a given thread count).
  std::vector<std::pair<int32_t, int64_t>> downs;
  for (size_t i = 0; i < segments.size(); ++i)
    for (int64_t h0 = 0; h0 < h; h0 += kDownRows) downs.push_back({static_cast<int32_t>(i), h0});
  const int64_t planes = shared ? 2 : 1;  // the shared expert's sum is rounded apart
  std::vector<float> partial(static_cast<size_t>(threads) * planes * t * h, 0.f);
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> y(kMaxSkinnyRows * kDownRows);
    float* mine = partial.data() + static_cast<size_t>(omp_get_thread_num()) * planes * t * h;
#pragma omp for schedule(static)
    for (size_t it = 0; it < downs.size(); ++it) {
      const Segment& sg = segments[downs[it].first];
      const Experts& ex = *sg.set;
      const int64_t h0 = downs[it].second, n = std::min(kDownRows, h - h0);
      float* out = mine + (sg.set == &routed ? 0 : t * h);
      if (large_out[downs[it].first].defined()) {
        const u16* yl = reinterpret_cast<const u16*>(large_out[downs[it].first].data_ptr<at::BFloat16>());
        for (int64_t r = 0; r < sg.count; ++r) {
          const float wt = weight[sg.begin + r];
          float* o = out + token[sg.begin + r] * h + h0;
          for (int64_t j = 0; j < n; ++j) o[j] += round_bf16(wt * bf16_to_float(yl[r * h + h0 + j]));
        }
        continue;
      }
      for (int64_t f = 0; f < sg.count; f += kMaxSkinnyRows) {
        const int m = static_cast<int>(std::min<int64_t>(kMaxSkinnyRows, sg.count - f));
        gemv_rows(ex.down(sg.expert) + h0 * ex.row2, ex.t2, sg.act + f * ex.inter, y.data(), n, ex.inter, m, int8);
        if (const u16* b = ex.down_bias(sg.expert))
          for (int r = 0; r < m; ++r) add_bias(y.data() + r * n, b + h0, n);
        for (int r = 0; r < m; ++r) {
          const float wt = weight[sg.begin + f + r];
          float* o = out + token[sg.begin + f + r] * h + h0;
          for (int64_t j = 0; j < n; ++j) o[j] += round_bf16(wt * round_bf16(y[r * n + j]));
        }
      }
    }
  }
  auto acc = torch::zeros({planes, t, h}, torch::dtype(torch::kFloat32));
  float* accp = acc.data_ptr<float>();
  const int64_t plane_elems = planes * t * h;
  for (int th = 0; th < threads; ++th) {
    const float* p = partial.data() + static_cast<size_t>(th) * plane_elems;
    for (int64_t i = 0; i < plane_elems; ++i) accp[i] += p[i];
  }
  auto out = acc[0].to(torch::kBFloat16);
  if (shared) out = out + acc[1].to(torch::kBFloat16);
  return out;
}
}  // namespace tacit
