// GGML block-quantized weights (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4, and FP8 e4m3 blocks) x 1-8 bf16
// activation rows, for decode.
#pragma once

#include <torch/extension.h>

#include <cstdint>

namespace tacit {

// GGML's type ids (ggml.h); kBf16 tags a plain bf16 matrix in the fused decoder. kF8E4M3 is
// tacit's own tag (outside ggml's enum, never written to a GGUF): an FP8 block-scaled checkpoint's
// weights as 36-byte blocks, its block's fp32 scale then 32 e4m3 values (kernels/ggml_quant.py).
enum GgmlType : int {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBf16 = 30,
  kMXFP4 = 39,
  kF8E4M3 = 200,
};

// A block's bytes and values: 32 values for the simple types, 256 (8 sub-blocks) for the
// K-quants. The one table every kernel (ggml_gemv.cpp, ggml_q4_groups.h, ggml_k_quants.h) reads.
template <int T>
constexpr int64_t kBlockBytes = T == kQ4_0   ? 18
                                 : T == kQ4_1 ? 20
                                 : T == kQ5_0 ? 22
                                 : T == kQ8_0 ? 34
                                 : T == kF8E4M3 ? 36
                                 : T == kMXFP4 ? 17
                                 : T == kQ4_K ? 144
                                 : T == kQ5_K ? 176
                                              : 210;
template <int T>
constexpr int64_t kBlockValues = T == kQ4_K || T == kQ5_K || T == kQ6_K ? 256 : 32;

// Q4_0, Q4_1, Q5_0, Q8_0, MXFP4 with 1-4 activation rows multiply activations rounded to int8 per
// 32-value block (llama.cpp's q8_0 / q8_1 arithmetic, vpdpbusd), the K-quants with 1-8 rows
// activations rounded per 256 values (q8_K, vpmaddubsw / vpdpwssd); on by default. Off (and at 5-8
// rows of the others, and for FP8): the blocks unpacked to bf16 against bf16 activations (the
// dequantized model's arithmetic).
// Each engine chooses (EngineArgs.ggml_bf16_activations), so two engines in one process can
// differ: the choice is the calling thread's, held by a GgmlActivations scope around a call
// (gemm_ggml_skinny's argument, the fused decoder's setting, moe_experts' argument), and the
// kernels read it on that thread before they fan out to their worker threads.
bool ggml_int8_activations();
class GgmlActivations {
 public:
  explicit GgmlActivations(bool int8);
  ~GgmlActivations();
  GgmlActivations(const GgmlActivations&) = delete;
  GgmlActivations& operator=(const GgmlActivations&) = delete;

 private:
  bool saved_;
};

// Bytes of a row of k values, or 0 for a type without a kernel here or k not whole blocks.
int64_t ggml_row_bytes(int type, int64_t k);
// Values in a row of `bytes` bytes (0 for a type without a kernel here).
int64_t ggml_row_values(int type, int64_t bytes);

// y[m, n] (fp32) = x[m, k] @ dequant(w)[n, k]^T, w uint8 [n, ggml_row_bytes(type, k)], 1 <= m <= 8;
// y's rows ldy floats apart (0: n), so a merged projection's shards can fill their own columns.
void gemv_ggml(const uint8_t* w, int type, const uint16_t* x, float* y, int64_t n, int64_t k, int m, int64_t ldy = 0);
// The same for rows [begin, end) of w on the calling thread alone (a worker thread: the caller
// passes the ggml_int8_activations() it read before fanning out).
void gemv_ggml_rows(const uint8_t* w, int type, const uint16_t* x, float* y, int64_t n, int64_t begin, int64_t end,
                    int64_t k, int m, bool int8_activations);

// bf16 [n, k]: each weight dequantized in fp32, rounded once (what prefill multiplies by).
torch::Tensor ggml_dequantize(torch::Tensor weight, int64_t type, int64_t k);

// weight uint8 [N, ggml_row_bytes(type, K)], x bf16 [M, K], 1 <= M <= 8 -> [M, N] bf16.
torch::Tensor gemm_ggml_skinny(torch::Tensor weight, int64_t type, torch::Tensor x, bool int8_activations);

}  // namespace tacit
