// What prefix_attention.cpp's two kernels share: the bfloat16 one (AVX512-BF16, and AMX
// tiles) and the float32 one (prefix_f32.h, AVX2 and FMA). Each splits the keys into work
// items of one KV head and one chunk of keys, leaves an unnormalised partial per query
// and item, and merges a query's items exactly at the end (merge_items).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>

namespace hearth::prefix {

constexpr float kNoScore = -1e30f;

struct Partials {  // per (chunk, head, query): max, sum of weights, unnormalised output
  float* max;
  float* sum;
  float* out;
};

// The partials of `chunks` items for each of `rows` (head, query) rows, [chunk][row]. Every
// slot is written by its item (no zeroing: it cost 2 % of a call).
struct Items {
  std::unique_ptr<float[]> max, sum, out;
  Items(int64_t chunks, int64_t rows, int64_t d)
      : max(new float[chunks * rows]), sum(new float[chunks * rows]),
        out(new float[chunks * rows * d]) {}
  Partials partials() const { return {max.get(), sum.get(), out.get()}; }
};

// The result over no keys at all: outputs 0, log-sum-exps -inf (nothing to merge).
inline std::tuple<at::Tensor, at::Tensor> no_keys(int64_t heads, int64_t n, int64_t d,
                                                  const at::TensorOptions& options) {
  at::Tensor out = at::empty({heads, n, d}, options.dtype(at::kFloat)).zero_();
  at::Tensor lse = at::empty({heads, n}, options.dtype(at::kFloat));
  lse.fill_(-std::numeric_limits<float>::infinity());
  return {out, lse};
}

// Which of an item's keys each query sees: all n, or under a chunk's causal mask
// (``causal_tokens`` Q: row r of a head is token r % Q, and sees the keys before
// (r % Q) + (T - Q) + 1). A key a row cannot see takes no part in its max and weighs 0.
struct Visible {
  int64_t tokens = 0;  // Q: 0 for no mask
  int64_t offset = 0;  // T - Q: the keys before the chunk's own
  int64_t t0 = 0;      // the item's first key
  // How many of the item's first n keys query row r (of its head) sees.
  int64_t of(int64_t r, int64_t n) const {
    if (tokens == 0) return n;
    return std::clamp<int64_t>(r % tokens + offset + 1 - t0, 0, n);
  }
};

// Keys per item: enough items for every thread (about four each), at most `most`, whole
// tiles of `tile` keys.
inline int64_t chunk_keys(int64_t heads, int64_t keys, int64_t most, int64_t tile) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t share = (heads * keys + 4 * threads - 1) / (4 * threads);
  const int64_t tiles = std::max<int64_t>(1, (share + tile - 1) / tile);
  return std::min(most, tiles * tile);
}

// Each of `rows` (head, query) rows' `chunks` partials merged: out = sum_c e^(m_c - M) o_c /
// L with L = sum_c e^(m_c - M) l_c, and its log-sum-exp M + log L. Every row sees a key of
// some chunk (key 0 is in chunk 0), so L >= 1: the best chunk's own max weighs 1.
inline void merge_items(const Partials& parts, int64_t chunks, int64_t rows, int64_t d,
                        float* dst, float* lse_dst) {
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t hq = begin; hq < end; ++hq) {
      float best = kNoScore;
      for (int64_t c = 0; c < chunks; ++c) best = std::max(best, parts.max[c * rows + hq]);
      float total = 0.0f;
      float* o = dst + hq * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t slot = c * rows + hq;
        const float w = std::exp(parts.max[slot] - best);
        total += w * parts.sum[slot];
        const float* src = parts.out + slot * d;
        for (int64_t x = 0; x < d; ++x) o[x] += w * src[x];
      }
      const float inv = 1.0f / total;
      for (int64_t x = 0; x < d; ++x) o[x] *= inv;
      lse_dst[hq] = best + std::log(total);
    }
  });
}

}  // namespace hearth::prefix
