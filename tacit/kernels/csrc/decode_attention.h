// Decode attention (one query token per row) read straight from tacit's paged bf16 KV cache.
#pragma once

#include <cstdint>

namespace tacit {

struct PagedKV {
  const uint16_t* k;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const uint16_t* v;  // same layout
  int64_t block_size, num_kv_heads, head_dim;
};

// q: row r's query heads at q + r * q_stride, [num_heads, head_dim]; positions[r] + 1 keys per
// row, found through tables[r * table_width + j / block_size]; out: [m, num_heads, head_dim].
void decode_attention(const uint16_t* q, int64_t q_stride, const int64_t* positions, const int64_t* tables,
                      int64_t table_width, const PagedKV& kv, int64_t num_heads, float scale, uint16_t* out, int m);

}  // namespace tacit
