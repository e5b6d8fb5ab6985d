// How far ahead of the line it reads a GGML GEMV's weight stream asks for the next lines.
//
// The int8 kernels spend ~20 cycles per 64-144 bytes of weights, so the hardware prefetcher alone
// left them short of the read bandwidth. 5632 x 2048, one activation row, two threads, weights
// cycled from DRAM (`python scripts/ggml_gemv_speed.py --rows 1 --from-dram TYPE`, two runs each),
// lines asked for 4 KB ahead of the position in the stream against the build before (no
// prefetch; for Q4_K and Q6_K also the pairwise kernel ggml_k_quants.h replaced): Q4_0 26.0-28.5 ->
// 35.1-35.7 GB/s, Q4_1 28.0-29.2 -> 33.6-34.3, Q4_K 28.1-28.5 -> 33.1-36.6, Q6_K 27.7-28.6 ->
// 32.8-33.5; Q8_0 (which had prefetched 8 rows ahead) 26.9-33.8 -> 30.9-34.7. In a C++ loop over
// all of random:llama-1b's layers 2 KB and 8 KB ahead read no better. A prefetch past the
// weight's end is a hint, never a fault.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace tacit {

constexpr int64_t kPrefetchAhead = 4096;

// The line kPrefetchAhead bytes past p (and the next, for a step that reads more than 64 bytes).
template <int kLines = 1>
inline void prefetch_ahead(const uint8_t* p) {
  for (int line = 0; line < kLines; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead + 64 * line), _MM_HINT_T0);
}

}  // namespace tacit
