// Decode attention (one query token per row) read straight from tacit's paged KV cache, bf16
// or int8 (kernels/kv_quant.py: each row's int8 values, then its fp32 scale).
#pragma once

#include <cstdint>

namespace tacit {

struct PagedKV {
  const uint16_t* k;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const uint16_t* v;  // same layout
  int64_t block_size, num_kv_heads, head_dim;
  // V's width when it is the first v_dim values of each head_dim-wide row (0: head_dim): MLA's
  // latent cache row is [latent (R), k_pe (rope)], K the whole row and V its latent, v == k.
  int64_t v_dim = 0;
};

// kernels/kv_quant.py's paged int8 layout: per (block, kv head), block_size rows of head_dim
// int8 values (K's with the sign bit flipped), then block_size fp32 scales.
struct PagedKVInt8 {
  const int8_t* k;  // [num_blocks, num_kv_heads, block_size * (head_dim + 4)]
  const int8_t* v;  // same layout
  int64_t block_size, num_kv_heads, head_dim;
  int64_t run_bytes() const { return block_size * (head_dim + 4); }  // one (block, head)
};

// MLA's int8 latent cache (kernels/kv_quant.py pack_rows, as MLAWriteKV writes it): one row per
// token, [rank int8 values][fp32 scale][rope int8 values][fp32 scale], values stored as they are
// (no sign flip: the latent is also the value, read signed).
struct LatentCacheInt8 {
  const int8_t* rows;  // [num_blocks, block_size, row_bytes()]
  int64_t block_size, rank, rope;
  int64_t row_bytes() const { return rank + rope + 2 * 4; }
};

// q: row r's query heads at q + r * q_stride, [num_heads, head_dim]; positions[r] + 1 keys per
// row, found through tables[r * table_width + j / block_size]; out: [m, num_heads, v_dim].
void decode_attention(const uint16_t* q, int64_t q_stride, const int64_t* positions, const int64_t* tables,
                      int64_t table_width, const PagedKV& kv, int64_t num_heads, float scale, uint16_t* out, int m);
void decode_attention_int8(const uint16_t* q, int64_t q_stride, const int64_t* positions, const int64_t* tables,
                           int64_t table_width, const PagedKVInt8& kv, int64_t num_heads, float scale, uint16_t* out,
                           int m);

// MLA's absorbed decode over the int8 latent cache: q [m, num_heads, rank + rope] (row r at
// q + r * q_stride), every head attending the same rows (key: the whole row, value: its latent);
// out [m, num_heads, rank]. positions and tables as above.
void mla_decode_attention_int8(const uint16_t* q, int64_t q_stride, const int64_t* positions, const int64_t* tables,
                               int64_t table_width, const LatentCacheInt8& kv, int64_t num_heads, float scale,
                               uint16_t* out, int m);

// One cached row: d bf16 values -> d int8 values and their fp32 scale, the arithmetic of
// kernels/kv_quant.py quantize_rows, bit for bit; flip_sign for K (stored as k + 128).
void quantize_kv_row(const uint16_t* x, int64_t d, int8_t* values, float* scale, bool flip_sign);

}  // namespace tacit
