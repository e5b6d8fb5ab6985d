#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "fused_moe.h"
#include "ggml_gemv.h"
#include "fused_decode.h"

namespace tacit {
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor kv_cache, torch::Tensor positions,
                                     torch::Tensor block_tables, double scale);
torch::Tensor mla_decode_attention(torch::Tensor q, torch::Tensor latent_cache, torch::Tensor positions,
                                   torch::Tensor block_tables, double scale, int64_t v_dim);
std::tuple<torch::Tensor, torch::Tensor> kv_quantize_rows(torch::Tensor x, bool flip_sign);
torch::Tensor head_bmm_bf16(torch::Tensor x, torch::Tensor w);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm_bf16_skinny", &tacit::gemm_bf16_skinny, "bf16 weight x 1-8 activation rows (AVX512-BF16)");
  m.def("gemm_ggml_skinny", &tacit::gemm_ggml_skinny,
        "GGML Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K or FP8 block weight x 1-8 bf16 activation rows; int8_activations: "
        "llama.cpp's int8-rounded activations (ggml_gemv.h) or bf16 ones",
        pybind11::arg("weight"), pybind11::arg("type"), pybind11::arg("x"), pybind11::arg("int8_activations"));
  m.def("ggml_dequantize", &tacit::ggml_dequantize, "GGML Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K or FP8 block weight -> bf16 [N, K]");
  m.def("paged_decode_attention", &tacit::paged_decode_attention,
        "decode attention over a bf16 or int8 paged KV cache [2, blocks, block_size, Hkv, D(+4)]",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("mla_decode_attention", &tacit::mla_decode_attention,
        "MLA decode over the bf16 or int8 latent cache [blocks, block_size, R + rope (+ 8)]: o_latent [m, H, v_dim]",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("head_bmm_bf16", &tacit::head_bmm_bf16, "x [T, H, K] @ w[h] for w [H, K, N] bf16 (absorbed MLA)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("kv_quantize_rows", &tacit::kv_quantize_rows, "the int8 KV cache's row quantizer (kernels/kv_quant.py)");
  m.def("moe_route", &tacit::moe_route, "MoE routing: softmax or grouped sigmoid top-k, as torch.topk selects",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def(
      "moe_experts",
      [](torch::Tensor x, torch::Tensor topk_weights, torch::Tensor topk_ids, torch::Tensor w13, int64_t w13_type,
         torch::Tensor w2, int64_t w2_type, std::optional<torch::Tensor> shared_w13, int64_t shared_w13_type,
         std::optional<torch::Tensor> shared_w2, int64_t shared_w2_type, std::optional<torch::Tensor> expert_slots,
         bool int8_activations, std::optional<torch::Tensor> w13_bias, std::optional<torch::Tensor> w2_bias,
         int64_t activation, double alpha, double limit) {
        const tacit::GgmlActivations activations(int8_activations);
        return tacit::moe_experts(x, topk_weights, topk_ids, w13, w13_type, w2, w2_type, shared_w13, shared_w13_type,
                                  shared_w2, shared_w2_type, expert_slots, w13_bias, w2_bias, activation, alpha,
                                  limit);
      },
      "MoE experts: bf16 or GGML expert weights, shared expert fused; int8_activations as gemm_ggml_skinny's; "
      "routed biases and activation (0 silu, 1 swigluoai with alpha, limit) as fused_moe.h says",
      pybind11::arg("x"), pybind11::arg("topk_weights"), pybind11::arg("topk_ids"), pybind11::arg("w13"),
      pybind11::arg("w13_type"), pybind11::arg("w2"), pybind11::arg("w2_type"), pybind11::arg("shared_w13"),
      pybind11::arg("shared_w13_type"), pybind11::arg("shared_w2"), pybind11::arg("shared_w2_type"),
      pybind11::arg("expert_slots"), pybind11::arg("int8_activations"), pybind11::arg("w13_bias") = pybind11::none(),
      pybind11::arg("w2_bias") = pybind11::none(), pybind11::arg("activation") = 0, pybind11::arg("alpha") = 1.702,
      pybind11::arg("limit") = 7.0, pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<tacit::FusedDecoder>(m, "FusedDecoder")
      .def(pybind11::init<torch::Tensor, int64_t, int64_t, torch::Tensor, torch::Tensor, torch::Tensor, int64_t,
                          int64_t, int64_t, int64_t, double, double, int64_t>())
      .def("add_layer", &tacit::FusedDecoder::add_layer)
      .def("add_moe", &tacit::FusedDecoder::add_moe)
      .def("add_mla_layer", &tacit::FusedDecoder::add_mla_layer)
      .def("add_grouped_moe", &tacit::FusedDecoder::add_grouped_moe)
      .def("forward", &tacit::FusedDecoder::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("embed", &tacit::FusedDecoder::embed)
      .def("run_layers", &tacit::FusedDecoder::run_layers, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("final_norm", &tacit::FusedDecoder::final_norm)
      .def("set_all_reduce", &tacit::FusedDecoder::set_all_reduce)
      .def("set_data_parallel_rows", &tacit::FusedDecoder::set_data_parallel_rows)
      .def_property_readonly("all_reduce_seconds", &tacit::FusedDecoder::all_reduce_seconds)
      .def_property_readonly("all_reduce_seconds_per_layer", &tacit::FusedDecoder::all_reduce_seconds_per_layer)
      .def("set_phase_timing", &tacit::FusedDecoder::set_phase_timing)
      .def("set_ggml_int8_activations", &tacit::FusedDecoder::set_ggml_int8_activations)
      .def_property_readonly("ggml_int8_activations", &tacit::FusedDecoder::ggml_int8_activations)
      .def_property_readonly("phase_timing", &tacit::FusedDecoder::phase_timing)
      .def_property_readonly("phase_seconds", &tacit::FusedDecoder::phase_seconds)
      .def_property_readonly_static("phase_names",
                                    [](pybind11::object) { return tacit::FusedDecoder::phase_names(); })
      .def_property_readonly("num_layers", &tacit::FusedDecoder::num_layers);
}
