// A whole decode step in one call, for both layer families tacit fuses: GQA layers (SmolLM2,
// Llama 2/3, Qwen2/2.5, Qwen3, Qwen3-MoE) and DeepSeek-V3's MLA layers, for single-token
// requests over tacit's paged KV cache (bf16, or int8 rows with a scale each).
#pragma once

#include <torch/extension.h>

#include "ggml_gemv.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tacit {

torch::Tensor gemm_bf16_skinny(torch::Tensor weight, torch::Tensor x);

// A merged projection (q/k/v, gate/up): one matrix, or, where its shards are GGML blocks of
// different types (llama.cpp's Q4_K_M: a Q6_K v beside Q4_K q and k), one part per shard in
// output order, each [rows, row bytes] in its own type, filling its own columns of the output.
struct Projection {
  std::vector<torch::Tensor> parts;
  std::vector<int> types;  // ggml_gemv.h's tags: kBf16 for a bf16 [out, in] matrix, else GGML blocks
  bool defined() const { return !parts.empty(); }
};

// MLA attention (DeepSeek-V3, Kimi-K2) in place of q/k/v: the query through q_a, its norm and
// q_b (or one q_proj, q_a undefined), the latent and the rotary key through kv_a and the latent's
// norm, cached as one row [rank + rope] per token (bf16, or kernels/kv_quant.py's int8 rows);
// decode attends over the latent with the absorbed per-head weights w_uk [H, nope, rank] and
// w_uv_t [H, rank, v] (kernels/absorbed_mla_attention.py).
struct MlaWeights {
  Projection q_a, q_b, kv_a;
  torch::Tensor q_a_norm, kv_a_norm, w_uk, w_uv_t, latent_cache;
  int64_t rank = 0, rope = 0, nope = 0, v_dim = 0;
  bool head_bmm = false;  // the absorbed products through csrc/head_bmm.cpp (its shapes), else torch.bmm
  bool defined() const { return kv_a.defined(); }
};

struct DecoderLayerWeights {
  torch::Tensor input_norm, qkv_bias, q_norm, k_norm, o_proj, o_bias, post_norm, down, kv_cache;
  Projection qkv, gate_up;
  // o_proj's and down's GGML type (ggml_gemv.h): kBf16 for a bf16 [out, in] matrix, else its blocks.
  int o_type, down_type;
  // A sparse MoE MLP (Qwen3-MoE) in place of gate_up/down: router bf16 [E, hidden], experts as
  // fused_moe.h takes them, softmax top-k routing.
  torch::Tensor router, experts_w13, experts_w2;
  int experts_w13_type = kBf16, experts_w2_type = kBf16;
  int64_t top_k = 0;
  bool renormalize = false;
  // Streamed experts (--expert-cache-memory): called with the step's expert ids and the normed
  // rows, it makes those experts resident in the cache the stacks above are, and returns the
  // expert -> slot table (it runs Python: it takes the GIL).
  std::function<torch::Tensor(torch::Tensor, torch::Tensor)> expert_slots;
  // DeepSeek-V3's routing instead (router_f32 defined): float32 router [E, hidden], sigmoid with
  // the correction bias, group-limited top-k, scaled; its shared expert fused into the experts call.
  torch::Tensor router_f32, correction_bias, shared_w13, shared_w2;
  int shared_w13_type = kBf16, shared_w2_type = kBf16;
  int64_t groups = 1, topk_groups = 1;
  double scaling = 1.0;
  MlaWeights mla;
  bool moe() const { return top_k > 0; }
};

// Sums a buffer over the tensor-parallel ranks in place (dtype_code 0: float32); returns 0, or
// non-zero after writing a message into err (err_len bytes): a C function of another extension
// (the shared-memory communicator's tacit_shm_all_reduce), called with no Python in between.
using AllReduceFn = int (*)(void* ctx, void* data, int64_t numel, int dtype_code, char* err, int64_t err_len);

// The phases a decode layer's time splits into when FusedDecoder::set_phase_timing is on.
enum DecodePhase : int { kPhaseNorm = 0, kPhaseGemm, kPhaseAttention, kPhaseMoeRouting, kPhaseExperts, kNumPhases };

class FusedDecoder {
 public:
  // embed: bf16 [vocab, hidden] (embed_type kBf16) or a GGML type's uint8 blocks.
  FusedDecoder(torch::Tensor embed, int64_t embed_type, int64_t hidden, torch::Tensor final_norm,
               torch::Tensor cos_table, torch::Tensor sin_table, int64_t num_heads, int64_t num_kv_heads,
               int64_t head_dim, int64_t intermediate, double eps, double scale, int64_t block_size);
  // qkv and gate_up: a Projection's parts and their types (one part unless the shards mix GGML types).
  void add_layer(torch::Tensor input_norm, std::vector<torch::Tensor> qkv, std::optional<torch::Tensor> qkv_bias,
                 std::optional<torch::Tensor> q_norm, std::optional<torch::Tensor> k_norm, torch::Tensor o_proj,
                 std::optional<torch::Tensor> o_bias, torch::Tensor post_norm,
                 std::optional<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> down,
                 torch::Tensor kv_cache, std::vector<int64_t> qkv_types, int64_t o_type,
                 std::vector<int64_t> gate_up_types, int64_t down_type);
  // The last added layer's MLP is a sparse MoE (it was added without gate_up and down).
  void add_moe(torch::Tensor router, torch::Tensor w13, int64_t w13_type, torch::Tensor w2, int64_t w2_type,
               int64_t top_k, bool renormalize,
               std::optional<std::function<torch::Tensor(torch::Tensor, torch::Tensor)>> expert_slots);
  // An MLA decoder layer (the decoder was built with head_dim = the rotary width, num_kv_heads
  // 1): q_a/q_a_norm absent for a plain q_proj (given as q_b); gate_up/down absent for an MoE
  // layer (add_grouped_moe follows). head_bmm: the absorbed products through csrc/head_bmm.cpp
  // (absorbed_mla_attention.head_bmm_fits), else torch.bmm, as the torch path picks.
  void add_mla_layer(torch::Tensor input_norm, std::optional<torch::Tensor> q_a, int64_t q_a_type,
                     std::optional<torch::Tensor> q_a_norm, torch::Tensor q_b, int64_t q_b_type, torch::Tensor kv_a,
                     int64_t kv_a_type, torch::Tensor kv_a_norm, torch::Tensor w_uk, torch::Tensor w_uv_t,
                     torch::Tensor o_proj, int64_t o_type, torch::Tensor post_norm,
                     std::optional<std::vector<torch::Tensor>> gate_up, std::optional<torch::Tensor> down,
                     std::vector<int64_t> gate_up_types, int64_t down_type, torch::Tensor latent_cache,
                     bool head_bmm);
  // The last added layer's MLP is DeepSeek-V3's MoE (see DecoderLayerWeights::router_f32);
  // expert_slots as add_moe's (an expert-parallel rank's table: its stacks hold its experts).
  void add_grouped_moe(torch::Tensor router_f32, torch::Tensor correction_bias, torch::Tensor w13, int64_t w13_type,
                       torch::Tensor w2, int64_t w2_type, int64_t top_k, bool renormalize, int64_t groups,
                       int64_t topk_groups, double scaling, torch::Tensor shared_w13, int64_t shared_w13_type,
                       torch::Tensor shared_w2, int64_t shared_w2_type,
                       std::optional<std::function<torch::Tensor(torch::Tensor, torch::Tensor)>> expert_slots);
  // token_ids [m], positions [m] (the token's index in its sequence; the context is
  // positions + 1 tokens), block_tables [m, B] -> final-normed hidden states [m, hidden] bf16.
  torch::Tensor forward(torch::Tensor token_ids, torch::Tensor positions, torch::Tensor block_tables);
  // The same step in pieces, so the caller can act between layers (an urgent prefill cutting
  // into a long step): x = embed(ids); run_layers(x, ..., begin, end) in place; final_norm(x).
  torch::Tensor embed(torch::Tensor token_ids) const;
  void run_layers(torch::Tensor x, torch::Tensor positions, torch::Tensor block_tables, int64_t begin, int64_t end);
  torch::Tensor final_norm(torch::Tensor x) const;
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Tensor parallelism: this rank holds its share of the heads and intermediate features; the
  // o_proj and down_proj partial sums (float32) go through all_reduce before the residual add.
  // fn and ctx are the addresses of an AllReduceFn and its context.
  void set_all_reduce(int64_t fn, int64_t ctx);
  // Data-parallel attention (tacit/layers/data_parallel.py): this rank's attention is whole and
  // runs its own `rows` of x, which sit at `offset` among the `total` rows of every rank; each
  // MLP runs on all `total` rows, gathered (an all-reduce of zero-padded float32 rows, exact: one
  // rank writes each row) and its split partial sums all-reduced, this rank keeping its rows.
  // total 0 turns it off. Set before each run_layers call.
  void set_data_parallel_rows(int64_t offset, int64_t total);
  // Seconds this rank spent inside the all-reduces (waiting for the slowest rank included: the
  // communication a step exposes) since the decoder was built: in all, and per layer as
  // [after attention, after the MLP] pairs.
  double all_reduce_seconds() const;
  std::vector<double> all_reduce_seconds_per_layer() const { return layer_reduce_s_; }
  // Per-layer per-phase timers for `tacit profile` (kPhaseNames order), off by default: when off
  // the step pays one predictable branch per phase boundary. Turning them on zeroes them; they
  // then sum seconds since, [layer * kNumPhases + phase]. The all-reduces are never inside a
  // phase (all_reduce_seconds_per_layer counts them), nor are buffer setup and row checks.
  void set_phase_timing(bool on);
  bool phase_timing() const { return phase_timing_; }
  std::vector<double> phase_seconds() const { return phase_s_; }
  static std::vector<std::string> phase_names();
  // GGML decode rows against int8-rounded activations (the default) or bf16 ones: the engine's
  // choice (EngineArgs.ggml_bf16_activations), applied to every step this decoder runs.
  void set_ggml_int8_activations(bool on) { int8_activations_ = on; }
  bool ggml_int8_activations() const { return int8_activations_; }

 private:
  void check_rows(const torch::Tensor& positions, const torch::Tensor& block_tables, int64_t m) const;
  int64_t num_blocks() const;  // in the KV pool (every layer's cache has as many)
  // A dense MLP's gate_up and down into w (neither: an MoE layer, added next).
  void set_dense_mlp(DecoderLayerWeights& w, const std::optional<std::vector<torch::Tensor>>& gate_up,
                     const std::optional<torch::Tensor>& down, const std::vector<int64_t>& gate_up_types,
                     int64_t down_type) const;

  torch::Tensor embed_, final_norm_, cos_, sin_;
  int64_t hidden_, num_heads_, num_kv_heads_, head_dim_, intermediate_, block_size_, max_positions_;
  int embed_type_;
  float eps_, scale_;
  std::vector<DecoderLayerWeights> layers_;
  AllReduceFn all_reduce_ = nullptr;
  void* all_reduce_ctx_ = nullptr;
  std::vector<double> layer_reduce_s_;  // 2 per layer
  int64_t dp_offset_ = 0, dp_total_ = 0;  // set_data_parallel_rows
  bool phase_timing_ = false;
  bool int8_activations_ = true;  // set_ggml_int8_activations
  std::vector<double> phase_s_;  // kNumPhases per layer while phase_timing_
  void reduce(float* data, int64_t numel, int64_t slot);
};

}  // namespace tacit
