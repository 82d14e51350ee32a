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
// On a CPU with AMX-BF16 (and a Linux that grants the tiles; ``use_attention_amx``
// decides, as for decode attention), both products run on AMX tiles instead
// (prefix_amx.h, ``run_chunk_amx``): 16 queries a block, two blocks at a time, with the
// same softmax (``weigh``), partials and merge. There torch's flash kernel multiplies on
// tiles too, and this path beat it by 1.1-1.5x (default model) and 1.0-1.2x (the 1.5B's
// heads) over the 6,300-token house on a 2-vCPU Xeon, where the vector path was 3-4x
// slower than both (docs/benchmarks.md, "Prefix attention on AMX tiles").
//
// **Causal** (``causal_tokens`` Q > 0): the queries are a chunk's own Q tokens (grouped
// heads folded in: row r is token r % Q) over their own keys, the last Q of which are
// theirs: row r sees the keys before (r % Q) + (T - Q) + 1, as the chunk's causal mask
// (attention.py's ``_own_mask``) has it. A key a row cannot see takes no part in its max
// and weighs 0, exactly as a key past the item's end; the products are computed anyway
// (a chunk's own keys are few). A warm 85-token suffix of the default model (3 KV heads
// of 3 grouped queries): 124 us a layer here against 274 us through torch's flash kernel
// with the mask it needs, which attention.py built per layer (2-vCPU EPYC, AVX512-BF16).
//
// Rounding: the scores and sums are float32 with exact bf16 products; the weights are
// rounded to bfloat16 before the value sum, as torch's flash kernel does for bf16 inputs.
// Without AVX512-BF16 (the build's -march=native decides), ``prefix_attention_ready``
// is false and attention.py keeps torch's kernel for bfloat16. Float32 queries go to
// prefix_f32.h's kernel (AVX2 and FMA), with the same items, visibility and merge
// (prefix_common.h).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "hearth_native.h"
#include "prefix_amx.h"
#include "prefix_common.h"
#include "prefix_f32.h"
#include "vec.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512BF16__)

using namespace hearth::vec;  // NOLINT(build/namespaces): the kernels' vocabulary
using hearth::prefix::kNoScore;
using hearth::prefix::Partials;
using hearth::prefix::Visible;

constexpr int64_t kChunk = 512;  // keys per work item, at most (its K and V: 2 x 64 KiB at D 64)
constexpr int64_t kKeyTile = 32;  // keys scored together: two vectors of 16 lanes
constexpr int kQueries = 8;       // queries scored together: 8 x 2 float32 accumulators
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

inline __m512bh as_bh(__m512i x) {
  __m512bh out;
  std::memcpy(&out, &x, sizeof(out));
  return out;
}

// 2^t for t <= 0, 16 lanes: the weights, whose scores are kept in log2 units (the scale
// times log2(e) is folded into the one multiply the scores already take). t = n + f with
// n = round(t) and |f| <= 1/2; 2^f is a degree-3 polynomial fitted to the relative error
// (at most 7.5e-5: the weights are rounded to bfloat16, whose steps are 2^-8 = 3.9e-3,
// before the values are summed), and VSCALEFPS multiplies in 2^n. The weights are this
// kernel's vector work, bound by the FMA port: degree 3 instead of 5 (float32-exact)
// made the AMX path's weights about a sixth cheaper (2-vCPU Xeon). Below -125 clamps, so
// no weight is subnormal; keys past the chunk's end are zeroed by the caller.
inline __m512 exp2_weights(__m512 t) {
  t = _mm512_max_ps(t, _mm512_set1_ps(-125.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(5.517150089144707e-2f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4261096119880676e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.932609677314758e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999280571937561e-1f));
  return _mm512_scalef_ps(p, n);
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

struct Weighed {
  float max;  // the largest score, in natural units (the merge's)
  float sum;  // of the float32 weights
};

// One query's weights over an item's keys. Its raw scores come 16 keys at a time, the
// blocks s_step floats apart (16: one row; the AMX path's tiles: 256); w16 gets the
// weights 2^(s scale2 - max) rounded to bfloat16 in key order, 32 keys at a time w_step
// elements apart, 0 for keys past n. The scale is positive, so the max is taken on the raw
// scores and scaled once, and each weight's exponent is one fused multiply-subtract.
Weighed weigh(const float* s, int64_t s_step, int64_t n, int64_t padded, float scale2,
              uint16_t* w16, int64_t w_step) {
  const int64_t blocks = padded / kLanes, whole = n / kLanes;
  const auto live = [n](int64_t b) -> __mmask16 {  // block b's keys before n
    const int64_t count = std::clamp<int64_t>(n - b * kLanes, 0, kLanes);
    return static_cast<__mmask16>((1u << count) - 1u);
  };
  __m512 top[4];  // four chains: one max waits for the one before it
  for (__m512& t : top) t = _mm512_set1_ps(kNoScore);
  int64_t b = 0;
  for (; b + 4 <= whole; b += 4)
    for (int c = 0; c < 4; ++c)
      top[c] = _mm512_max_ps(top[c], _mm512_loadu_ps(s + (b + c) * s_step));
  for (; b < whole; ++b) top[0] = _mm512_max_ps(top[0], _mm512_loadu_ps(s + b * s_step));
  if (whole < blocks && n % kLanes != 0)  // the tail: keys past n take no part
    top[1] = _mm512_mask_max_ps(top[1], live(whole), top[1], _mm512_loadu_ps(s + whole * s_step));
  const __m512 most = _mm512_max_ps(_mm512_max_ps(top[0], top[1]), _mm512_max_ps(top[2], top[3]));
  const float best = _mm512_reduce_max_ps(most) * scale2;
  const __m512 factor = _mm512_set1_ps(scale2), shift = _mm512_set1_ps(best);
  __m512 total0 = _mm512_setzero_ps(), total1 = _mm512_setzero_ps();
  for (b = 0; b < blocks; b += 2) {
    __m512 p0 = exp2_weights(_mm512_fmsub_ps(_mm512_loadu_ps(s + b * s_step), factor, shift));
    __m512 p1 =
        exp2_weights(_mm512_fmsub_ps(_mm512_loadu_ps(s + (b + 1) * s_step), factor, shift));
    if ((b + 2) * kLanes > n) {  // keys past n weigh 0 (exp2 clamps at -125, never 0)
      p0 = _mm512_maskz_mov_ps(live(b), p0);
      p1 = _mm512_maskz_mov_ps(live(b + 1), p1);
    }
    total0 = _mm512_add_ps(total0, p0);
    total1 = _mm512_add_ps(total1, p1);
    const __m512bh both = _mm512_cvtne2ps_pbh(p1, p0);  // p0 in the low half: key order
    std::memcpy(w16 + (b / 2) * w_step, &both, sizeof(both));
  }
  return {best * kLn2, _mm512_reduce_add_ps(_mm512_add_ps(total0, total1))};  // natural units
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

// One item: KV head h's keys [t0, t0 + n) against all of that head's queries.
template <int C>
void run_chunk(const uint32_t* qw, int64_t queries, int64_t padded_queries, const uint16_t* k,
               const uint16_t* v, int64_t k_step, int64_t v_step, int64_t n, float scale,
               const Partials& parts, int64_t slot0, const Visible& sees) {
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
  const float scale2 = scale * kLog2e;  // scores in log2 units: the weights are 2^(s - max)
  std::vector<float> block_out(static_cast<size_t>(kQueries) * D);
  for (int64_t q0 = 0; q0 < padded_queries; q0 += kQueries) {
    const uint32_t* qb = qw + q0 * Half;
    for (int64_t t = 0; t < padded; t += kKeyTile)
      score_tile<Half>(qb, kp.data() + (t / kLanes) * Half * kLanes, scores.data() + t, padded);
    const int live = static_cast<int>(std::min<int64_t>(kQueries, queries - q0));
    for (int i = 0; i < live; ++i) {
      const int64_t slot = slot0 + q0 + i;
      const Weighed w = weigh(scores.data() + i * padded, kLanes, sees.of(q0 + i, n), padded,
                              scale2, reinterpret_cast<uint16_t*>(pw.data() + i * padded / 2),
                              kKeyTile);
      parts.max[slot] = w.max;
      parts.sum[slot] = w.sum;
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

#if defined(HEARTH_AMX)
namespace tiles = hearth::amx::prefix;

// One item on AMX tiles (prefix_amx.h), with run_chunk's partials: KV head h's keys [t0,
// t0 + n) against all of that head's queries, 32 at a time (two blocks share the value
// products' loads). qa: the head's query tiles.
void run_chunk_amx(const uint16_t* qa, int64_t queries, const uint16_t* k, const uint16_t* v,
                   int64_t k_step, int64_t v_step, int64_t n, int64_t d, float scale,
                   const Partials& parts, int64_t slot0, const Visible& sees) {
  constexpr int64_t R = hearth::amx::kRows;
  const int64_t padded = (n + kKeyTile - 1) / kKeyTile * kKeyTile;
  const int64_t blocks = padded / R, groups = padded / kKeyTile, cs = d / 32;
  thread_local std::vector<uint32_t> kt;
  thread_local std::vector<uint16_t> vb, pw;
  thread_local std::vector<float> scores, out;
  kt.resize(padded * d / 2);
  vb.resize(padded * d);
  pw.resize(2 * R * padded);
  scores.resize(R * padded);
  out.resize(2 * R * d);
  tiles::pack_keys(k, k_step, n, padded, d, kt.data());
  tiles::pack_values(v, v_step, n, padded, d, vb.data());
  const float scale2 = scale * kLog2e;
  for (int64_t q0 = 0; q0 < queries; q0 += 2 * R) {
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t first = q0 + half * R;
      const int64_t live = std::clamp<int64_t>(queries - first, 0, R);
      uint16_t* p = pw.data() + half * groups * tiles::kElems;
      if (live > 0) tiles::scores(qa + (first / R) * cs * tiles::kElems, kt.data(), d, blocks,
                                  scores.data());
      for (int64_t i = 0; i < live; ++i) {
        const Weighed w = weigh(scores.data() + i * R, tiles::kScoreTile, sees.of(first + i, n),
                                padded, scale2, p + i * kKeyTile, tiles::kElems);
        parts.max[slot0 + first + i] = w.max;
        parts.sum[slot0 + first + i] = w.sum;
      }
      for (int64_t i = live; i < R; ++i)  // rows past the queries weigh nothing
        for (int64_t g = 0; g < groups; ++g)
          std::memset(p + g * tiles::kElems + i * kKeyTile, 0, kKeyTile * sizeof(uint16_t));
    }
    tiles::values_pair(pw.data(), vb.data(), groups, d, out.data());
    const int64_t rows = std::min(2 * R, queries - q0);
    std::memcpy(parts.out + (slot0 + q0) * d, out.data(), rows * d * sizeof(float));
  }
}
#endif

using ChunkFn = void (*)(const uint32_t*, int64_t, int64_t, const uint16_t*, const uint16_t*,
                         int64_t, int64_t, int64_t, float, const Partials&, int64_t,
                         const Visible&);

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

std::tuple<at::Tensor, at::Tensor> prefix_attention_bf16(const at::Tensor& query,
                                                         const at::Tensor& keys,
                                                         const at::Tensor& values, double scale,
                                                         int64_t causal_tokens) {
  const int64_t heads = query.size(0), n = query.size(1), d = query.size(2), t = keys.size(1);
  const ChunkFn run = chunk_fn(d);
  TORCH_CHECK(run != nullptr, "prefix attention takes head sizes 32, 64, 128 or 256, not ", d);
  const int half = static_cast<int>(d / 2);
  const auto* qsrc = reinterpret_cast<const uint16_t*>(query.data_ptr<c10::BFloat16>());
  // The queries packed once for every item of their head: 8-query blocks of pairs for the
  // vector path, 16-row A tiles for the AMX path (decided once per call).
  const bool use_tiles = hearth::amx::on();
  const int64_t block = use_tiles ? hearth::amx::kRows : kQueries;
  const int64_t padded_queries = (n + block - 1) / block * block;
  std::vector<uint32_t> qw(heads * padded_queries * half);
  for (int64_t h = 0; h < heads; ++h) {
    const uint16_t* src = qsrc + h * query.stride(0);
    uint32_t* dst = qw.data() + h * padded_queries * half;
#if defined(HEARTH_AMX)
    if (use_tiles) {
      tiles::pack_queries(src, query.stride(1), n, d, reinterpret_cast<uint16_t*>(dst));
      continue;
    }
#endif
    pack_queries(src, query.stride(1), n, padded_queries, half, dst);
  }
  if (t == 0) return hearth::prefix::no_keys(heads, n, d, query.options());
  at::Tensor out = at::empty({heads, n, d}, query.options().dtype(at::kFloat));
  at::Tensor lse = at::empty({heads, n}, query.options().dtype(at::kFloat));
  const int64_t size = hearth::prefix::chunk_keys(heads, t, kChunk, kKeyTile);
  const int64_t chunks = (t + size - 1) / size;
  const hearth::prefix::Items items(chunks, heads * n, d);
  const Partials parts = items.partials();
  const auto* ks = reinterpret_cast<const uint16_t*>(keys.data_ptr<c10::BFloat16>());
  const auto* vs = reinterpret_cast<const uint16_t*>(values.data_ptr<c10::BFloat16>());
  at::parallel_for(0, heads * chunks, 1, [&](int64_t begin, int64_t end) {
#if defined(HEARTH_AMX)
    if (use_tiles) hearth::amx::configure();
#endif
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / chunks, c = item % chunks, t0 = c * size;
      const uint32_t* qh = qw.data() + h * padded_queries * half;
      const uint16_t* k = ks + h * keys.stride(0) + t0 * keys.stride(1);
      const uint16_t* v = vs + h * values.stride(0) + t0 * values.stride(1);
      const int64_t len = std::min(size, t - t0), slot0 = (c * heads + h) * n;
      const Visible sees{causal_tokens, t - causal_tokens, t0};
#if defined(HEARTH_AMX)
      if (use_tiles) {
        run_chunk_amx(reinterpret_cast<const uint16_t*>(qh), n, k, v, keys.stride(1),
                      values.stride(1), len, d, static_cast<float>(scale), parts, slot0, sees);
        continue;
      }
#endif
      run(qh, n, padded_queries, k, v, keys.stride(1), values.stride(1), len,
          static_cast<float>(scale), parts, slot0, sees);
    }
#if defined(HEARTH_AMX)
    if (use_tiles) hearth::amx::release();  // this thread's tiles: nothing left to save
#endif
  });
  hearth::prefix::merge_items(parts, chunks, heads * n, d, out.data_ptr<float>(),
                              lse.data_ptr<float>());
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

bool prefix_attention_f32_ready() {
#if defined(HEARTH_PREFIX_F32)
  return true;
#else
  return false;
#endif
}

bool prefix_attention_f32_first() {
#if defined(HEARTH_PREFIX_F32) && !defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

std::tuple<at::Tensor, at::Tensor> prefix_attention(const at::Tensor& query,
                                                    const at::Tensor& keys,
                                                    const at::Tensor& values, double scale,
                                                    int64_t causal_tokens) {
  TORCH_CHECK(query.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(),
              "prefix attention runs on the CPU");
  const auto kind = query.scalar_type();
  TORCH_CHECK((kind == at::kBFloat16 || kind == at::kFloat) && keys.scalar_type() == kind &&
                  values.scalar_type() == kind,
              "prefix attention takes bfloat16 or float32, all alike");
  TORCH_CHECK(kind == at::kFloat ? prefix_attention_f32_ready() : prefix_attention_ready(),
              kind == at::kFloat ? "float32 prefix attention needs a CPU with AVX2 and FMA"
                                 : "prefix attention needs a CPU with AVX512-BF16");
  TORCH_CHECK(query.dim() == 3 && keys.dim() == 3 && values.dim() == 3,
              "prefix attention takes query [H, N, D] and keys, values [H, T, D]");
  TORCH_CHECK(keys.sizes() == values.sizes(), "keys and values must have one shape");
  TORCH_CHECK(keys.size(0) == query.size(0) && keys.size(2) == query.size(2),
              "keys must have the query's heads and head size");
  TORCH_CHECK(query.stride(2) == 1 && keys.stride(2) == 1 && values.stride(2) == 1,
              "prefix attention needs the head dimension contiguous");
  TORCH_CHECK(causal_tokens >= 0 && (causal_tokens == 0 || (query.size(1) % causal_tokens == 0 &&
                                                            keys.size(1) >= causal_tokens)),
              "causal prefix attention needs whole groups of the chunk's tokens and its keys");
#if defined(HEARTH_PREFIX_F32)
  if (kind == at::kFloat) {
    return hearth::prefix_f32::attention(query, keys, values, scale, causal_tokens);
  }
#endif
#if defined(__AVX512BF16__)
  return prefix_attention_bf16(query, keys, values, scale, causal_tokens);
#else
  return {};
#endif
}

}  // namespace hearth
