#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "fused_moe.h"
#include "ggml_gemv.h"
#include "llama_decode.h"

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
  m.def("gemm_ggml_skinny", &tacit::gemm_ggml_skinny, "GGML Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K or FP8 block weight x 1-8 bf16 activation rows");
  m.def("set_ggml_int8_activations", &tacit::set_ggml_int8_activations,
        "GGML decode rows (1-4): int8 activations per 32-value block (default) or bf16");
  m.def("ggml_int8_activations", &tacit::ggml_int8_activations);
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
  m.def("moe_experts", &tacit::moe_experts, "MoE experts: bf16 or GGML expert weights, shared expert fused",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<tacit::LlamaDecoder>(m, "LlamaDecoder")
      .def(pybind11::init<torch::Tensor, int64_t, int64_t, torch::Tensor, torch::Tensor, torch::Tensor, int64_t,
                          int64_t, int64_t, int64_t, double, double, int64_t>())
      .def("add_layer", &tacit::LlamaDecoder::add_layer)
      .def("add_moe", &tacit::LlamaDecoder::add_moe)
      .def("add_mla_layer", &tacit::LlamaDecoder::add_mla_layer)
      .def("add_grouped_moe", &tacit::LlamaDecoder::add_grouped_moe)
      .def("forward", &tacit::LlamaDecoder::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("embed", &tacit::LlamaDecoder::embed)
      .def("run_layers", &tacit::LlamaDecoder::run_layers, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("final_norm", &tacit::LlamaDecoder::final_norm)
      .def("set_all_reduce", &tacit::LlamaDecoder::set_all_reduce)
      .def("set_data_parallel_rows", &tacit::LlamaDecoder::set_data_parallel_rows)
      .def_property_readonly("all_reduce_seconds", &tacit::LlamaDecoder::all_reduce_seconds)
      .def_property_readonly("all_reduce_seconds_per_layer", &tacit::LlamaDecoder::all_reduce_seconds_per_layer)
      .def("set_phase_timing", &tacit::LlamaDecoder::set_phase_timing)
      .def_property_readonly("phase_timing", &tacit::LlamaDecoder::phase_timing)
      .def_property_readonly("phase_seconds", &tacit::LlamaDecoder::phase_seconds)
      .def_property_readonly_static("phase_names",
                                    [](pybind11::object) { return tacit::LlamaDecoder::phase_names(); })
      .def_property_readonly("num_layers", &tacit::LlamaDecoder::num_layers);
}
