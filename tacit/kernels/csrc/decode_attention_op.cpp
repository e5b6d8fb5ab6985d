// decode_attention / decode_attention_int8 as a torch op over a layer's whole KV cache tensor,
// for the kernel tests and `tacit bench attention` (the fused decode step calls the kernels
// directly).
#include <torch/extension.h>

#include "decode_attention.h"

namespace tacit {
namespace {

// Every row's position within its block table, and every block it reads inside the cache.
void check_rows(const torch::Tensor& positions, const torch::Tensor& block_tables, int64_t m, int64_t bs,
                int64_t blocks) {
  TORCH_CHECK(positions.size(0) == m && block_tables.size(0) == m, "one position and block table per row");
  const int64_t width = block_tables.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  for (int64_t r = 0; r < m; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] / bs < width, "position ", pos[r], " beyond row ", r, "'s block table");
    for (int64_t b = 0; b <= pos[r] / bs; ++b)
      TORCH_CHECK(tables[r * width + b] >= 0 && tables[r * width + b] < blocks, "block id outside the cache");
  }
}

}  // namespace

// q [m, H, D] bf16; kv_cache [2, blocks, block_size, Hkv, D] bf16 or kernels/kv_quant.py's
// int8 [2, blocks, Hkv, block_size * (D + 4)];
// positions [m] int64 (the query's index: positions + 1 keys); block_tables [m, B] int64.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor kv_cache, torch::Tensor positions,
                                     torch::Tensor block_tables, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && q.dim() == 3 && q.is_contiguous(), "q: contiguous [m, H, D] bf16");
  const bool int8_kv = kv_cache.scalar_type() == torch::kInt8;
  TORCH_CHECK(kv_cache.dim() == (int8_kv ? 4 : 5) && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache: [2, blocks, bs, Hkv, D] bf16 or [2, blocks, Hkv, bs * (D + 4)] int8");
  TORCH_CHECK(positions.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kLong,
              "positions and block_tables must be int64");
  positions = positions.contiguous();
  block_tables = block_tables.contiguous();
  const int64_t m = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t hkv = int8_kv ? kv_cache.size(2) : kv_cache.size(3);
  const int64_t bs = int8_kv ? kv_cache.size(3) / (d + 4) : kv_cache.size(2);
  const int64_t blocks = kv_cache.size(1), width = block_tables.size(1);
  TORCH_CHECK(h % hkv == 0, "query heads must be a multiple of kv heads");
  check_rows(positions, block_tables, m, bs, blocks);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  auto out = torch::empty({m, h, d}, q.options());
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t half = kv_cache.numel() / 2;
  if (int8_kv) {
    TORCH_CHECK(kv_cache.size(3) == bs * (d + 4), "an int8 cache holds block_size x (head_dim + 4) bytes per block and head");
    const int8_t* c = kv_cache.data_ptr<int8_t>();
    decode_attention_int8(qp, h * d, pos, tables, width, PagedKVInt8{c, c + half, bs, hkv, d}, h,
                          static_cast<float>(scale), op, static_cast<int>(m));
  } else {
    TORCH_CHECK(kv_cache.scalar_type() == torch::kBFloat16 && kv_cache.size(4) == d, "a bf16 cache row is head_dim values");
    const auto* c = reinterpret_cast<const uint16_t*>(kv_cache.data_ptr<at::BFloat16>());
    decode_attention(qp, h * d, pos, tables, width, PagedKV{c, c + half, bs, hkv, d}, h, static_cast<float>(scale),
                     op, static_cast<int>(m));
  }
  return out;
}

// MLA's absorbed decode (kernels/absorbed_mla_attention.py): every head attends the same cached
// rows, as GQA with one kv head whose key is the whole row and whose value is its first v_dim
// values (the latent). q [m, H, R + rope] bf16 (q_nope absorbed through W_UK, then q_pe);
// latent_cache [blocks, block_size, R + rope] bf16, or kernels/kv_quant.py's int8 rows
// [blocks, block_size, R + 4 + rope + 4] (each part's int8 values, then its fp32 scale: v_dim is
// R there); positions, block_tables as above -> the weighted latents o_latent [m, H, v_dim] bf16
// (softmax in fp32), read in place with no gather.
torch::Tensor mla_decode_attention(torch::Tensor q, torch::Tensor latent_cache, torch::Tensor positions,
                                   torch::Tensor block_tables, double scale, int64_t v_dim) {
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && q.dim() == 3 && q.is_contiguous(), "q: contiguous [m, H, D] bf16");
  const bool int8_kv = latent_cache.scalar_type() == torch::kInt8;
  TORCH_CHECK((int8_kv || latent_cache.scalar_type() == torch::kBFloat16) && latent_cache.dim() == 3 &&
                  latent_cache.is_contiguous(),
              "latent_cache: contiguous [blocks, block_size, row] bf16 or int8, got ", latent_cache.scalar_type(), " ",
              latent_cache.sizes());
  TORCH_CHECK(positions.scalar_type() == torch::kLong && block_tables.scalar_type() == torch::kLong,
              "positions and block_tables must be int64");
  positions = positions.contiguous();
  block_tables = block_tables.contiguous();
  const int64_t m = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t blocks = latent_cache.size(0), bs = latent_cache.size(1), width = block_tables.size(1);
  TORCH_CHECK(v_dim > 0 && v_dim <= d, "v_dim must be within the row");
  if (int8_kv) {
    TORCH_CHECK(v_dim < d && latent_cache.size(2) == d + 8,
                "an int8 latent cache row is the latent (v_dim) and rope int8 values, each followed by its fp32 "
                "scale: R + 4 + rope + 4 = ", d + 8, " bytes for this query's width ", d, ", got ",
                latent_cache.size(2));
  } else {
    TORCH_CHECK(latent_cache.size(2) == d, "a cache row is the query's width (R + rope)");
  }
  check_rows(positions, block_tables, m, bs, blocks);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  auto out = torch::empty({m, h, v_dim}, q.options());
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  if (int8_kv) {
    const LatentCacheInt8 kv{latent_cache.data_ptr<int8_t>(), bs, v_dim, d - v_dim};
    mla_decode_attention_int8(qp, h * d, pos, tables, width, kv, h, static_cast<float>(scale), op, static_cast<int>(m));
    return out;
  }
  const auto* c = reinterpret_cast<const uint16_t*>(latent_cache.data_ptr<at::BFloat16>());
  PagedKV kv{c, c, bs, 1, d};
  kv.v_dim = v_dim;
  decode_attention(qp, h * d, pos, tables, width, kv, h, static_cast<float>(scale), op, static_cast<int>(m));
  return out;
}

// x [n, d] bf16 -> (int8 [n, d], fp32 [n]): the int8 cache's quantizer, as the fused step runs it.
std::tuple<torch::Tensor, torch::Tensor> kv_quantize_rows(torch::Tensor x, bool flip_sign) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2, "x: [n, d] bf16");
  x = x.contiguous();
  const int64_t n = x.size(0), d = x.size(1);
  auto values = torch::empty({n, d}, torch::dtype(torch::kInt8));
  auto scales = torch::empty({n}, torch::dtype(torch::kFloat32));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  for (int64_t r = 0; r < n; ++r)
    quantize_kv_row(xp + r * d, d, values.data_ptr<int8_t>() + r * d, scales.data_ptr<float>() + r, flip_sign);
  return {values, scales};
}

}  // namespace tacit
