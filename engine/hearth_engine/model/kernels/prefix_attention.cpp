// Attention of many queries over a cached prefix part, in bfloat16 dot products
// (AVX512-BF16): the warm prefill of a request reads the pinned house this way.
//
// Python side: hearth_engine/model/attention.py (``_partials``), native.py (build).
//
// A warm request prefills its own ~100 tokens over a 6,000-token house: with grouped
// heads folded in (attention.py), each KV head has a few hundred queries that all see
// every key of the part, with no mask. That is two matrix products per head, and torch's
// CPU flash kernel ran them at about 80 GFLOP/s on a 2-core EPYC, where a bf16 GEMM of
// the same rows runs at 280. This kernel is those two products written as a GEMM's inner
// loop: VDPBF16PS multiplies pairs of bfloat16 and adds them into float32 lanes, with the
// operand that is reused (keys, values) re-laid out once per work item so that one
// vector load feeds 8 (scores) or 16 / (D / 16) (outputs) queries.
//
// Work: items of one KV head and one chunk of at most kChunk keys, split over threads
// (at::parallel_for). An item packs its keys and values, then, 8 queries at a time,
// scores every key of the chunk (float32), takes one max and one sum per query for the
// whole chunk (no online rescaling inside an item), rounds the weights to bfloat16 and
// sums the values. Each item leaves an unnormalised partial per query; a last pass merges
// the chunks exactly (flash attention's rescaling) and returns the output and the
// log-sum-exp in float32, for attention.py's merge with the request's own keys.
//
// Rounding: the scores and sums are float32 with exact bf16 products; the weights are
// rounded to bfloat16 before the value sum, as torch's flash kernel does for bf16 inputs.
// Without AVX512-BF16 (the build's -march=native decides), ``prefix_attention_ready``
// is false and attention.py keeps torch's kernel.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "hearth_native.h"
#include "vec.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512BF16__)

using namespace hearth::vec;  // NOLINT(build/namespaces): the kernels' vocabulary

constexpr int64_t kChunk = 512;  // keys per work item, at most (its K and V: 2 x 64 KiB at D 64)
constexpr int64_t kKeyTile = 32;  // keys scored together: two vectors of 16 lanes
constexpr int kQueries = 8;       // queries scored together: 8 x 2 float32 accumulators
constexpr float kNoScore = -1e30f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

inline __m512bh as_bh(__m512i x) {
  __m512bh out;
  std::memcpy(&out, &x, sizeof(out));
  return out;
}

// 2^t for t <= 0, 16 lanes: the weights, whose scores are kept in log2 units (the scale
// times log2(e) is folded into the one multiply the scores already take). t = n + f with
// n = round(t) and |f| <= 1/2; 2^f is a degree-5 polynomial fitted to the relative error
// (at most 1.6e-7, about one float32 ulp, as exp16's), and VSCALEFPS multiplies in 2^n.
// About half the instructions of exp16: with exp16 the weights took about a tenth of this
// kernel's time, and this made the kernel 5-8 % faster (2-core EPYC, interleaved runs).
// Below -125 clamps, as exp16 does below -87 (e^-87 = 2^-125.5), so no weight is
// subnormal; keys past the chunk's end are zeroed by the caller.
inline f16v exp2_weights(f16v x) {
  __m512 t;
  std::memcpy(&t, &x, sizeof(t));
  t = _mm512_max_ps(t, _mm512_set1_ps(-125.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.327626290731132e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.67547670006752e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550713464617729e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022121727466583e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931469440460205e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192092896f));
  const __m512 y = _mm512_scalef_ps(p, n);
  f16v out;
  std::memcpy(&out, &y, sizeof(out));
  return out;
}

inline uint32_t pair_at(const uint16_t* p) {  // two bfloat16, the first in the low half
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// The queries of one KV head as 32-bit pairs of dimensions, [rows padded to 8][D / 2];
// padding rows are 0 (their scores are computed and never read).
void pack_queries(const uint16_t* q, int64_t step, int64_t n, int64_t padded, int half,
                  uint32_t* out) {
  for (int64_t i = 0; i < padded; ++i)
    for (int l = 0; l < half; ++l) out[i * half + l] = i < n ? pair_at(q + i * step + 2 * l) : 0;
}

// Keys for the scores: word (tile key j, pair l) at [(block * half + l) * 16 + j], where a
// block is 16 keys. Keys past n are 0.
void pack_keys(const uint16_t* k, int64_t step, int64_t n, int64_t padded, int half,
               uint32_t* out) {
  for (int64_t t = 0; t < padded; ++t) {
    uint32_t* dst = out + (t / kLanes) * half * kLanes + t % kLanes;
    for (int l = 0; l < half; ++l) dst[l * kLanes] = t < n ? pair_at(k + t * step + 2 * l) : 0;
  }
}

// Values for the output sum: pairs of keys (2m, 2m + 1) at each dimension d, the word
// at [m * D + d] (low half: key 2m). Keys past n are 0, so a 0 weight never meets a NaN.
void pack_values(const uint16_t* v, int64_t step, int64_t n, int64_t padded, int d,
                 uint32_t* out) {
  for (int64_t m = 0; m < padded / 2; ++m) {
    const uint16_t* a = v + (2 * m) * step;
    const uint16_t* b = v + (2 * m + 1) * step;
    const bool has_a = 2 * m < n, has_b = 2 * m + 1 < n;
    for (int x = 0; x < d; ++x) {
      const uint32_t lo = has_a ? a[x] : 0, hi = has_b ? b[x] : 0;
      out[m * d + x] = lo | (hi << 16);
    }
  }
}

// Scores of 8 queries against one tile of 32 keys: scores[i * stride + j].
template <int Half>
inline void score_tile(const uint32_t* qw, const uint32_t* kp, float* scores, int64_t stride) {
  __m512 acc[kQueries][2];
  for (int i = 0; i < kQueries; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int l = 0; l < Half; ++l) {
    const __m512bh k0 = as_bh(_mm512_loadu_si512(kp + l * kLanes));
    const __m512bh k1 = as_bh(_mm512_loadu_si512(kp + (Half + l) * kLanes));
    for (int i = 0; i < kQueries; ++i) {
      const __m512bh qb = as_bh(_mm512_set1_epi32(static_cast<int>(qw[i * Half + l])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], k0, qb);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], k1, qb);
    }
  }
  for (int i = 0; i < kQueries; ++i) {
    _mm512_storeu_ps(scores + i * stride, acc[i][0]);
    _mm512_storeu_ps(scores + i * stride + kLanes, acc[i][1]);
  }
}

// Unnormalised outputs of R queries (R * C vectors of accumulators) over `pairs` key
// pairs: out[i * D + x] = sum_t w[i][t] v[t][x].
template <int C, int R>
inline void value_pass(const uint32_t* pw, int64_t pw_stride, const uint32_t* vp, int64_t pairs,
                       float* out) {
  constexpr int D = C * kLanes;
  __m512 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_setzero_ps();
  for (int64_t m = 0; m < pairs; ++m) {
    __m512bh vz[C];
    for (int c = 0; c < C; ++c) vz[c] = as_bh(_mm512_loadu_si512(vp + m * D + c * kLanes));
    for (int i = 0; i < R; ++i) {
      const __m512bh wb = as_bh(_mm512_set1_epi32(static_cast<int>(pw[i * pw_stride + m])));
      for (int c = 0; c < C; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], vz[c], wb);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + i * D + c * kLanes, acc[i][c]);
}

struct Partials {  // per (chunk, head, query): max, sum of weights, unnormalised output
  float* max;
  float* sum;
  float* out;
};

// One item: KV head h's keys [t0, t0 + n) against all of that head's queries.
template <int C>
void run_chunk(const uint32_t* qw, int64_t queries, int64_t padded_queries, const uint16_t* k,
               const uint16_t* v, int64_t k_step, int64_t v_step, int64_t n, float scale,
               const Partials& parts, int64_t slot0) {
  constexpr int D = C * kLanes, Half = D / 2;
  constexpr int R = C >= kLanes ? 1 : kLanes / C;  // queries per value pass: 16 accumulators
  static_assert(kQueries % R == 0 || R > kQueries, "value passes tile the query block");
  constexpr int Passes = R >= kQueries ? 1 : kQueries / R;
  const int64_t padded = (n + kKeyTile - 1) / kKeyTile * kKeyTile;
  thread_local std::vector<uint32_t> kp, vp, pw;
  thread_local std::vector<float> scores;
  kp.resize(padded * Half);
  vp.resize(padded / 2 * D);
  pw.resize(kQueries * padded / 2);
  scores.resize(kQueries * padded);
  pack_keys(k, k_step, n, padded, Half, kp.data());
  pack_values(v, v_step, n, padded, D, vp.data());
  const int64_t blocks = padded / kLanes;
  const float scale2 = scale * kLog2e;  // scores in log2 units: the weights are 2^(s - max)
  std::vector<float> block_out(static_cast<size_t>(kQueries) * D);
  for (int64_t q0 = 0; q0 < padded_queries; q0 += kQueries) {
    const uint32_t* qb = qw + q0 * Half;
    for (int64_t t = 0; t < padded; t += kKeyTile)
      score_tile<Half>(qb, kp.data() + (t / kLanes) * Half * kLanes, scores.data() + t, padded);
    const int live = static_cast<int>(std::min<int64_t>(kQueries, queries - q0));
    for (int i = 0; i < live; ++i) {  // weights exp(s - max) in float32, kept as bf16 pairs
      float* s = scores.data() + i * padded;
      f16v top = splat(kNoScore);
      for (int64_t b = 0; b < blocks; ++b) {
        f16v x = load(s + b * kLanes) * scale2;
        if ((b + 1) * kLanes > n) {  // the tail: keys past n weigh nothing
          for (int j = 0; j < kLanes; ++j)
            if (b * kLanes + j >= n) x[j] = kNoScore;
        }
        store(s + b * kLanes, x);
        top = x > top ? x : top;
      }
      const float best = hmax(top);
      f16v total = {};
      uint16_t* w16 = reinterpret_cast<uint16_t*>(pw.data() + i * padded / 2);
      for (int64_t b = 0; b < blocks; b += 2) {
        f16v p0 = exp2_weights(load(s + b * kLanes) - best);
        f16v p1 = exp2_weights(load(s + (b + 1) * kLanes) - best);
        for (int j = 0; j < 2 * kLanes && (b + 2) * kLanes > n; ++j) {  // exp2 clamps at -125
          if (b * kLanes + j < n) continue;
          if (j < kLanes) {
            p0[j] = 0.0f;
          } else {
            p1[j - kLanes] = 0.0f;
          }
        }
        total += p0 + p1;
        __m512 lo, hi;
        std::memcpy(&lo, &p0, sizeof(lo));
        std::memcpy(&hi, &p1, sizeof(hi));
        const __m512bh both = _mm512_cvtne2ps_pbh(hi, lo);  // lo in the low half: key order
        std::memcpy(w16 + b * kLanes, &both, sizeof(both));
      }
      const int64_t slot = slot0 + q0 + i;
      parts.max[slot] = best * kLn2;  // back to natural units for the merge
      parts.sum[slot] = hsum(total);
    }
    for (int p = 0; p < Passes; ++p) {
      if (p * R >= live) break;
      value_pass<C, R>(pw.data() + p * R * padded / 2, padded / 2, vp.data(), padded / 2,
                       block_out.data() + p * R * D);
    }
    for (int i = 0; i < live; ++i)
      std::memcpy(parts.out + (slot0 + q0 + i) * D, block_out.data() + i * D, D * sizeof(float));
  }
}

using ChunkFn = void (*)(const uint32_t*, int64_t, int64_t, const uint16_t*, const uint16_t*,
                         int64_t, int64_t, int64_t, float, const Partials&, int64_t);

ChunkFn chunk_fn(int64_t d) {
  switch (d) {
    case 32:
      return run_chunk<2>;
    case 64:
      return run_chunk<4>;
    case 128:
      return run_chunk<8>;
    case 256:
      return run_chunk<16>;
    default:
      return nullptr;
  }
}

// Keys per item: enough items for every thread (about four each), at most kChunk, whole tiles.
int64_t chunk_keys(int64_t heads, int64_t keys) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t share = (heads * keys + 4 * threads - 1) / (4 * threads);
  const int64_t tiles = std::max<int64_t>(1, (share + kKeyTile - 1) / kKeyTile);
  return std::min(kChunk, tiles * kKeyTile);
}

std::tuple<at::Tensor, at::Tensor> prefix_attention_bf16(const at::Tensor& query,
                                                         const at::Tensor& keys,
                                                         const at::Tensor& values, double scale) {
  const int64_t heads = query.size(0), n = query.size(1), d = query.size(2), t = keys.size(1);
  const ChunkFn run = chunk_fn(d);
  TORCH_CHECK(run != nullptr, "prefix attention takes head sizes 32, 64, 128 or 256, not ", d);
  const int half = static_cast<int>(d / 2);
  const int64_t padded_queries = (n + kQueries - 1) / kQueries * kQueries;
  std::vector<uint32_t> qw(heads * padded_queries * half);
  const auto* qsrc = reinterpret_cast<const uint16_t*>(query.data_ptr<c10::BFloat16>());
  for (int64_t h = 0; h < heads; ++h)
    pack_queries(qsrc + h * query.stride(0), query.stride(1), n, padded_queries, half,
                 qw.data() + h * padded_queries * half);
  at::Tensor out = at::empty({heads, n, d}, query.options().dtype(at::kFloat));
  at::Tensor lse = at::empty({heads, n}, query.options().dtype(at::kFloat));
  if (t == 0) {
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  const int64_t size = chunk_keys(heads, t);
  const int64_t chunks = (t + size - 1) / size;
  std::vector<float> part_max(chunks * heads * n), part_sum(chunks * heads * n);
  std::vector<float> part_out(chunks * heads * n * d);
  const Partials parts{part_max.data(), part_sum.data(), part_out.data()};
  const auto* ks = reinterpret_cast<const uint16_t*>(keys.data_ptr<c10::BFloat16>());
  const auto* vs = reinterpret_cast<const uint16_t*>(values.data_ptr<c10::BFloat16>());
  at::parallel_for(0, heads * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / chunks, c = item % chunks, t0 = c * size;
      run(qw.data() + h * padded_queries * half, n, padded_queries,
          ks + h * keys.stride(0) + t0 * keys.stride(1),
          vs + h * values.stride(0) + t0 * values.stride(1), keys.stride(1), values.stride(1),
          std::min(size, t - t0), static_cast<float>(scale), parts, (c * heads + h) * n);
    }
  });
  // Merge each query's chunks: out = sum_c e^(m_c - M) o_c / L, L = sum_c e^(m_c - M) l_c.
  float* dst = out.data_ptr<float>();
  float* lse_dst = lse.data_ptr<float>();
  at::parallel_for(0, heads * n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t hq = begin; hq < end; ++hq) {
      float best = kNoScore;
      for (int64_t c = 0; c < chunks; ++c) best = std::max(best, part_max[c * heads * n + hq]);
      float total = 0.0f;
      float* o = dst + hq * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t slot = c * heads * n + hq;
        const float w = std::exp(part_max[slot] - best);
        total += w * part_sum[slot];
        const float* src = part_out.data() + slot * d;
        for (int64_t x = 0; x < d; ++x) o[x] += w * src[x];
      }
      const float inv = 1.0f / total;  // total >= 1: the best chunk's own max weighs 1
      for (int64_t x = 0; x < d; ++x) o[x] *= inv;
      lse_dst[hq] = best + std::log(total);
    }
  });
  return {out, lse};
}

#endif  // __AVX512BF16__

}  // namespace

namespace hearth {

bool prefix_attention_ready() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

std::tuple<at::Tensor, at::Tensor> prefix_attention(const at::Tensor& query,
                                                    const at::Tensor& keys,
                                                    const at::Tensor& values, double scale) {
  TORCH_CHECK(prefix_attention_ready(), "prefix attention needs a CPU with AVX512-BF16");
  TORCH_CHECK(query.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(),
              "prefix attention runs on the CPU");
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
                  values.scalar_type() == at::kBFloat16,
              "prefix attention takes bfloat16");
  TORCH_CHECK(query.dim() == 3 && keys.dim() == 3 && values.dim() == 3,
              "prefix attention takes query [H, N, D] and keys, values [H, T, D]");
  TORCH_CHECK(keys.sizes() == values.sizes(), "keys and values must have one shape");
  TORCH_CHECK(keys.size(0) == query.size(0) && keys.size(2) == query.size(2),
              "keys must have the query's heads and head size");
  TORCH_CHECK(query.stride(2) == 1 && keys.stride(2) == 1 && values.stride(2) == 1,
              "prefix attention needs the head dimension contiguous");
#if defined(__AVX512BF16__)
  return prefix_attention_bf16(query, keys, values, scale);
#else
  return {};
#endif
}

}  // namespace hearth
