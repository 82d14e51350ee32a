// prefix_attention.cpp's float32 kernel, in AVX2 and FMA: a warm prefill's queries over a
// cached prefix part (or, causal, a chunk's own keys) where the model runs in float32,
// as it does on every CPU without native bfloat16 (an N100, an AVX2 EPYC, a Xeon without
// AVX512-BF16). The default model's 85 tokens over its 3,200-token house, a layer, on two
// Zen 4 cores capped to AVX2 (where two FMA pipes of 8 lanes give 237 GFLOP/s): 3.8 ms
// here (166 GFLOP/s) against 5.3 ms through torch's flash kernel (119); the chunk's own
// keys, causal, 0.15 against 0.30 ms with the mask torch needs.
//
// The same work items and merge as the bfloat16 kernel (prefix_common.h). An item packs
// its keys as tiles of 16 keys by dimension (one vector load feeds 6 queries' FMAs), then,
// 6 queries at a time: scores for every key of the item (float32), one max and one sum
// per query for the item, float32 weights 2^(s - max), and the values summed for the 6
// at once, 16 dimensions a pass, straight from the KV (each row of values is contiguous). No rounding but
// float32's: the result is float32 attention, as the merge's.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "prefix_common.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HEARTH_PREFIX_F32 1
#endif

namespace hearth::prefix_f32 {

#if defined(HEARTH_PREFIX_F32)
using hearth::prefix::kNoScore;
using hearth::prefix::Partials;
using hearth::prefix::Visible;

constexpr int64_t kChunk = 256;  // keys per item, at most (its packed keys: 64 KiB at D 64)
constexpr int64_t kTile = 16;    // keys scored together: two vectors of 8
constexpr int kRows = 6;         // queries scored together: 6 x 2 accumulators
constexpr int kSlice = 16;       // output floats a value pass keeps per query (2 vectors)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^t for t <= 0, 8 lanes, to float32's precision: t = n + f with n = round(t), |f| <= 1/2;
// 2^f by its Taylor series in f ln 2 to degree 7 (truncation below 1e-9, relative), 2^n
// put into the exponent. Below -126 clamps: no subnormal weight (the largest weighs 1).
inline __m256 exp2_f32(__m256 t) {
  t = _mm256_max_ps(t, _mm256_set1_ps(-126.0f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 p = _mm256_set1_ps(1.5252733804059841e-5f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-4f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                          _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The lanes of the 8 keys from j on that are before n.
inline __m256 before(int64_t n, int64_t j) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const auto left = static_cast<int>(std::clamp<int64_t>(n - j, 0, 8));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane));
}

// Keys for the scores: tile b's dimension x at [(b * D + x) * 16 + j], written in order;
// keys past n are 0.
inline void pack_keys(const float* k, int64_t step, int64_t n, int64_t padded, int64_t d,
                      float* out) {
  for (int64_t b = 0; b < padded; b += kTile) {
    const int64_t live = std::clamp<int64_t>(n - b, 0, kTile);
    for (int64_t x = 0; x < d; ++x, out += kTile) {
      for (int64_t j = 0; j < live; ++j) out[j] = k[(b + j) * step + x];
      for (int64_t j = live; j < kTile; ++j) out[j] = 0.0f;
    }
  }
}

// Scores of kRows queries (rows of D floats) against one tile of 16 keys.
template <int D>
inline void score_tile(const float* q, const float* kp, float* scores, int64_t stride) {
  __m256 acc[kRows][2];
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int x = 0; x < D; ++x) {
    const __m256 k0 = _mm256_loadu_ps(kp + x * kTile), k1 = _mm256_loadu_ps(kp + x * kTile + 8);
    for (int i = 0; i < kRows; ++i) {
      const __m256 qb = _mm256_broadcast_ss(q + i * D + x);
      acc[i][0] = _mm256_fmadd_ps(qb, k0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(qb, k1, acc[i][1]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    _mm256_storeu_ps(scores + i * stride, acc[i][0]);
    _mm256_storeu_ps(scores + i * stride + 8, acc[i][1]);
  }
}

// One query's weights over the first n of `padded` raw scores (0 past n), its max in
// natural units and the weights' sum. The scale is positive: the max is taken raw.
inline void weigh(const float* s, int64_t n, int64_t padded, float scale2, float* w,
                  float* max_out, float* sum_out) {
  if (n == 0) {
    std::fill(w, w + padded, 0.0f);
    *max_out = kNoScore;
    *sum_out = 0.0f;
    return;
  }
  __m256 top = _mm256_set1_ps(kNoScore);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
  float best = hmax(top);
  for (; j < n; ++j) best = std::max(best, s[j]);
  best *= scale2;
  const __m256 factor = _mm256_set1_ps(scale2), shift = _mm256_set1_ps(best);
  __m256 total = _mm256_setzero_ps();
  for (j = 0; j < padded; j += 8) {
    __m256 p = exp2_f32(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), factor, shift));
    if (j + 8 > n) p = _mm256_and_ps(p, before(n, j));
    total = _mm256_add_ps(total, p);
    _mm256_storeu_ps(w + j, p);
  }
  *max_out = best * kLn2;
  *sum_out = hsum(total);
}

// kRows queries' unnormalised outputs over `keys` keys, out[i * D + x] = sum_t w_i[t]
// v[t][x], 16 dimensions at a time: each load of values feeds all the queries' FMAs.
template <int D>
inline void value_rows(const float* w, int64_t w_step, const float* v, int64_t v_step,
                       int64_t keys, float* out) {
  for (int xs = 0; xs < D; xs += kSlice) {
    __m256 acc[kRows][2];
    for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t t = 0; t < keys; ++t) {
      const float* row = v + t * v_step + xs;
      const __m256 x0 = _mm256_loadu_ps(row), x1 = _mm256_loadu_ps(row + 8);
      for (int i = 0; i < kRows; ++i) {
        const __m256 b = _mm256_broadcast_ss(w + i * w_step + t);
        acc[i][0] = _mm256_fmadd_ps(b, x0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(b, x1, acc[i][1]);
      }
    }
    for (int i = 0; i < kRows; ++i) {
      _mm256_storeu_ps(out + i * D + xs, acc[i][0]);
      _mm256_storeu_ps(out + i * D + xs + 8, acc[i][1]);
    }
  }
}

// One item: a KV head's keys [t0, t0 + n) against all of that head's queries (qh: rows of
// D floats, padded to kRows with zeros).
template <int D>
void run_item(const float* qh, int64_t queries, int64_t padded_queries, const float* k,
              const float* v, int64_t k_step, int64_t v_step, int64_t n, float scale,
              const Partials& parts, int64_t slot0, const Visible& sees) {
  const int64_t padded = (n + kTile - 1) / kTile * kTile;
  thread_local std::vector<float> kp, scores, weights;
  kp.resize(padded * D);
  scores.resize(kRows * padded);
  weights.resize(kRows * padded);
  pack_keys(k, k_step, n, padded, D, kp.data());
  const float scale2 = scale * kLog2e;
  float block_out[kRows * D];
  for (int64_t q0 = 0; q0 < padded_queries; q0 += kRows) {
    for (int64_t t = 0; t < padded; t += kTile)
      score_tile<D>(qh + q0 * D, kp.data() + t * D, scores.data() + t, padded);
    const int live = static_cast<int>(std::min<int64_t>(kRows, queries - q0));
    int64_t seen[kRows] = {};
    for (int i = 0; i < live; ++i) {
      const int64_t slot = slot0 + q0 + i;
      seen[i] = sees.of(q0 + i, n);
      weigh(scores.data() + i * padded, seen[i], padded, scale2, weights.data() + i * padded,
            &parts.max[slot], &parts.sum[slot]);
    }
    for (int i = live; i < kRows; ++i)  // padding rows weigh nothing
      std::fill(weights.begin() + i * padded, weights.begin() + (i + 1) * padded, 0.0f);
    const int64_t keys = *std::max_element(seen, seen + kRows);
    value_rows<D>(weights.data(), padded, v, v_step, keys, block_out);
    std::memcpy(parts.out + (slot0 + q0) * D, block_out, live * D * sizeof(float));
  }
}

using ItemFn = void (*)(const float*, int64_t, int64_t, const float*, const float*, int64_t,
                        int64_t, int64_t, float, const Partials&, int64_t, const Visible&);

inline ItemFn item_fn(int64_t d) {
  switch (d) {
    case 32:
      return run_item<32>;
    case 64:
      return run_item<64>;
    case 128:
      return run_item<128>;
    case 256:
      return run_item<256>;
    default:
      return nullptr;
  }
}

// query [H, N, D], keys and values [H, T, D], float32, the last dimension contiguous.
inline std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& query,
                                                    const at::Tensor& keys,
                                                    const at::Tensor& values, double scale,
                                                    int64_t causal_tokens) {
  const int64_t heads = query.size(0), n = query.size(1), d = query.size(2), t = keys.size(1);
  const ItemFn run = item_fn(d);
  TORCH_CHECK(run != nullptr, "prefix attention takes head sizes 32, 64, 128 or 256, not ", d);
  const int64_t padded_queries = (n + kRows - 1) / kRows * kRows;
  std::vector<float> qbuf(heads * padded_queries * d, 0.0f);
  const float* qsrc = query.data_ptr<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(qbuf.data() + (h * padded_queries + i) * d,
                  qsrc + h * query.stride(0) + i * query.stride(1), d * sizeof(float));
  if (t == 0) return hearth::prefix::no_keys(heads, n, d, query.options());
  at::Tensor out = at::empty({heads, n, d}, query.options());
  at::Tensor lse = at::empty({heads, n}, query.options());
  const int64_t size = hearth::prefix::chunk_keys(heads, t, kChunk, kTile);
  const int64_t chunks = (t + size - 1) / size;
  const hearth::prefix::Items items(chunks, heads * n, d);
  const Partials parts = items.partials();
  const float* ks = keys.data_ptr<float>();
  const float* vs = values.data_ptr<float>();
  at::parallel_for(0, heads * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / chunks, c = item % chunks, t0 = c * size;
      const Visible sees{causal_tokens, t - causal_tokens, t0};
      run(qbuf.data() + h * padded_queries * d, n, padded_queries,
          ks + h * keys.stride(0) + t0 * keys.stride(1),
          vs + h * values.stride(0) + t0 * values.stride(1), keys.stride(1), values.stride(1),
          std::min(size, t - t0), static_cast<float>(scale), parts, (c * heads + h) * n, sees);
    }
  });
  hearth::prefix::merge_items(parts, chunks, heads * n, d, out.data_ptr<float>(),
                              lse.data_ptr<float>());
  return {out, lse};
}
#endif  // HEARTH_PREFIX_F32

}  // namespace hearth::prefix_f32
