// The MoE kernels of fused_moe.cpp, for the whole-step decoder (fused_decode.cpp) to call.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>

namespace tacit {

// float32 router logits [T, E] -> (weights float32 [T, K], ids int64 [T, K]); softmax, or sigmoid
// with the correction bias and group-limited selection; experts selected as torch.topk selects.
std::tuple<torch::Tensor, torch::Tensor> moe_route(torch::Tensor logits, std::optional<torch::Tensor> bias,
                                                   int64_t top_k, bool sigmoid, bool renormalize, int64_t groups,
                                                   int64_t topk_groups, double scaling);

// How an expert joins gate and up (kernels/moe_kernel.py ExpertActivation): silu(gate) * up, or
// gpt-oss's (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g) with g = min(gate, limit).
enum ExpertActivationKind : int64_t { kActSilu = 0, kActSwigluOai = 1 };

// x bf16 [T, H] -> sum_k w_k * expert_k(x) (+ the shared expert) bf16 [T, H]; expert stacks bf16
// [E, rows, cols] or GGML blocks [E, rows, row_bytes] (type ids of ggml_gemv.h). The routed
// experts may carry bf16 biases (w13_bias [E, 2I] in w13's row order, w2_bias [E, H]: gate/up
// biases before the activation, the down bias before the routing weight) and gpt-oss's activation.
torch::Tensor moe_experts(torch::Tensor x, torch::Tensor topk_weights, torch::Tensor topk_ids, torch::Tensor w13,
                          int64_t w13_type, torch::Tensor w2, int64_t w2_type, std::optional<torch::Tensor> shared_w13,
                          int64_t shared_w13_type, std::optional<torch::Tensor> shared_w2, int64_t shared_w2_type,
                          std::optional<torch::Tensor> expert_slots,
                          std::optional<torch::Tensor> w13_bias = std::nullopt,
                          std::optional<torch::Tensor> w2_bias = std::nullopt, int64_t activation = kActSilu,
                          double alpha = 1.702, double limit = 7.0);

}  // namespace tacit
