// Decode attention for CPUs: one query token per row, grouped heads, shared prefixes
// read in place, split over threads along the keys (split-K), float32 arithmetic.
//
// Python side: hearth_engine/native.py (build, load, fallback) and attention.py (callers).
//
// The KV of one step is a set of *sources*: the rows' own working KV ([B, Hkv, S, D],
// optionally with a padding mask [B, S]) and shared prefix parts ([Hkv, T, D], read by
// all rows or by a listed subset). The work is cut into items of one KV head and one
// slice of one source's keys; an item handles every query that reads that slice (the
// grouped heads of every row reading it), so each key is read from memory once per step,
// however many heads and rows read it. Items run in parallel (at::parallel_for); each
// leaves an unnormalised partial (max, sum, output) per query, and a last pass merges
// them exactly (flash attention's rescaling). An item scores all its keys before it
// weighs them, so each query pays one max and one sum across lanes per item, not per 16
// keys: that took four rows on a 5,400-token house from 26.4 to 16.2 ms a step (30
// layers, 2-core EPYC) and one row from 8.9 to 7.0. Scores, softmax and the output sum
// are float32; the result is rounded once, to the model's dtype.
//
// bfloat16 KV on a CPU with AVX512-BF16 (head sizes that are multiples of 32): VDPBF16PS
// multiplies pairs of bfloat16 into float32 lanes. Scores come from the queries' and keys'
// own bfloat16 values (each product exact in float32, as the float path's; the scale is
// applied after the sum), and values two keys a step against the softmax weights rounded
// to bfloat16 once (relative 2^-9; the weights' sum adds the same rounded weights, so the
// output is still a convex combination of the values). No key or value is widened. Per
// layer and step, 2 threads: 1.5x faster at 500 and at 6,300 keys (docs/benchmarks.md).
//
// bfloat16 KV on a CPU with AMX-BF16 (and a Linux that grants the tiles): the same two
// products on AMX tiles (attention_amx.h), the scores straight from the key rows, up to
// 16 queries an item (more readers of a slice: more items). On a 2-vCPU Xeon the vector
// path was bound by its VDPBF16PS (0.92 ns each); with the tiles, one layer over 6,300
// keys took 462 -> 296 us (12 query heads on 2 KV heads, size 128) and three rows of
// SmolLM2's 9 on 3 heads 615 -> 319 us; whole steps on that house: the default model's
// Q4_K_M 26.3 -> 21.8 ms, Qwen2.5-1.5B's 78.8 -> 73.2 ms.
//
// Compiled with -O3 and the host's instruction set (see native.py): the inner loops are
// written so that the compiler vectorises them (no reductions across lanes other than the
// dot product, an exp built from arithmetic only).

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
// Only what the kernels use (not <torch/extension.h>, which only the bindings in
// module.cpp need): parsing all of torch's headers once per file took most of the build.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_amx.h"
#include "attention_bf16.h"
#include "hearth_native.h"
#include "vec.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kSlice = 256;         // keys per work item, at most
constexpr int64_t kSerialPairs = 4096;  // fewer key-query pairs in a step: no threads

using namespace hearth::vec;  // NOLINT(build/namespaces): the kernels' vocabulary
namespace amx = hearth::amx;

using hearth::attention::kNoScore;

template <typename T>
struct Item {
  const T* k;
  const T* v;
  int64_t k_step;
  int64_t v_step;
  int64_t t0;
  int64_t t1;
  const bool* keep;
  int64_t first_query;
  int64_t queries;
};

#if defined(__AVX512BF16__)
using hearth::attention::bf16::bf16_scores;
using hearth::attention::bf16::pair_values;
using hearth::attention::bf16::round_bf16;
using hearth::attention::bf16::unpair;
#endif

#if defined(HEARTH_AMX)
// The values of an item's keys weighed on AMX tiles (attention_amx.h): the weights of
// each 32 keys as an A tile per query row (bfloat16 already: see round_bf16), the values
// paired key by key; blocks nobody sees weigh zeros (their rows are not read). acc gets
// pair_values' layout, which ``unpair`` reorders.
template <int C>
void values_amx(const Item<c10::BFloat16>& item, const f16v* scores, int64_t stride,
                const bool* seen, int64_t blocks, int64_t nq, f16v* acc) {
  constexpr int64_t D = C * kLanes;
  constexpr int64_t kTileElems = amx::kTileBytes / 2;  // bfloat16 elements of a tile
  const int64_t groups = (blocks + 1) / 2;             // of 32 keys
  thread_local std::vector<uint16_t> p, vb;
  thread_local std::vector<float> out;
  thread_local std::vector<amx::KeyGroup> keys;
  p.assign(groups * kTileElems, 0);
  vb.resize(2 * 4 * kTileElems);
  out.resize(D / 16 * amx::kRows * amx::kRows);
  keys.resize(groups);
  const uint16_t* v = reinterpret_cast<const uint16_t*>(item.v);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t b0 = 2 * g, b1 = 2 * g + 1;
    const bool lo = seen[b0], hi = b1 < blocks && seen[b1];
    for (int64_t i = 0; i < nq; ++i) {
      const float* row = reinterpret_cast<const float*>(scores + i * stride);
      const __m512 w0 = lo ? _mm512_loadu_ps(row + b0 * kLanes) : _mm512_setzero_ps();
      const __m512 w1 = hi ? _mm512_loadu_ps(row + b1 * kLanes) : _mm512_setzero_ps();
      const __m512bh both = _mm512_cvtne2ps_pbh(w1, w0);  // keys 0-15 low, 16-31 high
      std::memcpy(&p[g * kTileElems + i * 32], &both, 64);
    }
    const int64_t t = item.t0 + g * 32;
    keys[g] = {v + t * item.v_step, lo ? 0 : kLanes,
               std::min<int64_t>(hi ? 32 : kLanes, item.t1 - t)};
  }
  amx::values(p.data(), keys.data(), groups, item.v_step, D, vb.data(), out.data());
  for (int64_t i = 0; i < nq; ++i)
    for (int c = 0; c < C; ++c)
      std::memcpy(&acc[i * C + c], &out[(c * amx::kRows + i) * kLanes], sizeof(f16v));
}
#endif

// One item, in three passes over its keys (at most kSlice, so its scores stay in L1):
// every query's scores, 16 keys at a time; then per query one max and one sum across
// lanes for the whole item (not per block of 16, as an online softmax would); then the
// weighted sum of the values. Each key and value is widened to float32 once, for all
// the item's queries (bfloat16 with AVX512-BF16: never, see the helpers above). Leaves,
// per query, the max, the sum of the weights and the unnormalised output. C = D / 16
// vectors per head.
template <typename T, int C>
void run_item(const Item<T>& item, const float* qf, const uint16_t* qb, bool use_tiles,
              float scale, const int64_t* query_ids, float* part_max, float* part_sum,
              float* part_out) {
  constexpr int D = C * kLanes;
  constexpr int64_t kMaxBlocks = kSlice / kLanes;
  const int64_t nq = item.queries;
  const int64_t blocks = (item.t1 - item.t0 + kLanes - 1) / kLanes;
  thread_local std::vector<f16v> q, scores, acc;
  q.resize(nq * C);
  scores.resize(nq * kMaxBlocks);
  acc.assign(nq * C, f16v{});
  for (int64_t i = 0; i < nq; ++i)
    for (int c = 0; c < C; ++c)
      q[i * C + c] = load(qf + query_ids[item.first_query + i] * D + c * kLanes);
  i16v visible[kMaxBlocks];
  bool seen[kMaxBlocks];
  bool blocks_done = false;  // the values already weighed (AMX)
#if defined(__AVX512BF16__)
  constexpr bool kPairs = std::is_same<T, c10::BFloat16>::value && C % 2 == 0;
  const bool pairs = kPairs && qb != nullptr;  // bfloat16 dot products (scores and values)
#else
  const bool pairs = false;
#endif
#if defined(HEARTH_AMX)
  // AMX tiles for both products (the call's choice; add_items keeps items to 16 queries).
  const bool tiles = use_tiles && pairs && nq <= amx::kRows;
  thread_local std::vector<uint32_t> qt;
  thread_local std::vector<uint16_t> kpad;
  thread_local std::vector<float> st;
  if (tiles) {
    const uint16_t* rows[amx::kRows];
    for (int64_t i = 0; i < nq; ++i) rows[i] = qb + query_ids[item.first_query + i] * D;
    qt.resize(D / 32 * amx::kTileBytes / 4);
    amx::pack_queries(rows, nq, D, qt.data());
    st.resize(amx::kRows * amx::kRows);
    amx::configure();
  }
#endif
  const f16v lane_index = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  f16v kv[kLanes][C];
  for (int64_t blk = 0; blk < blocks; ++blk) {  // scores
    const int64_t t = item.t0 + blk * kLanes, n = std::min<int64_t>(kLanes, item.t1 - t);
    visible[blk] = lane_index < static_cast<float>(n);
    if (item.keep != nullptr) {
      i16v kept = {};
      for (int64_t j = 0; j < n; ++j) kept[j] = item.keep[t + j] ? -1 : 0;
      visible[blk] &= kept;
    }
    seen[blk] = false;
    for (int j = 0; j < kLanes; ++j) seen[blk] |= visible[blk][j] != 0;
    if (!seen[blk]) continue;
#if defined(HEARTH_AMX)
    if (tiles) {
      const uint16_t* kr = reinterpret_cast<const uint16_t*>(item.k + t * item.k_step);
      int64_t k_step = item.k_step;
      if (n < kLanes) {  // a short block: its rows and zeros, never past the keys
        kpad.assign(kLanes * D, 0);
        for (int64_t j = 0; j < n; ++j) std::memcpy(&kpad[j * D], kr + j * k_step, D * 2);
        kr = kpad.data();
        k_step = D;
      }
      amx::scores(kr, k_step, qt.data(), D, st.data());
      const __m512i column = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160,
                                               176, 192, 208, 224, 240);  // row starts
      for (int64_t i = 0; i < nq; ++i) {  // query i's scores: column i of the tile
        const __m512 raw = _mm512_i32gather_ps(column, st.data() + i, 4);
        f16v s;
        std::memcpy(&s, &raw, sizeof(s));
        scores[i * kMaxBlocks + blk] = visible[blk] ? s * scale : splat(kNoScore);
      }
      continue;
    }
#endif
#if defined(__AVX512BF16__)
    if constexpr (kPairs) {
      if (pairs) {
        __m512i raw[kLanes][C / 2];
        for (int64_t j = 0; j < kLanes; ++j) {  // key j at kBitrev[j], as below
          const T* kr = item.k + (t + std::min<int64_t>(j, n - 1)) * item.k_step;
          for (int c = 0; c < C / 2; ++c)
            raw[kBitrev[j]][c] = j < n ? _mm512_loadu_si512(kr + c * 2 * kLanes)
                                       : _mm512_setzero_si512();
        }
        bf16_scores<C>(raw, qb, query_ids + item.first_query, nq, scale, visible[blk],
                       &scores[blk], kMaxBlocks);
        continue;
      }
    }
#endif
    for (int64_t j = 0; j < kLanes; ++j) {  // key j at kBitrev[j]: its score lands in lane j
      const T* kr = item.k + (t + std::min<int64_t>(j, n - 1)) * item.k_step;
      for (int c = 0; c < C; ++c) kv[kBitrev[j]][c] = j < n ? load16(kr + c * kLanes) : f16v{};
    }
    for (int64_t i = 0; i < nq; ++i) {
      const f16v* qi = &q[i * C];
      f16v part[kLanes];
      for (int j = 0; j < kLanes; ++j) {
        f16v s = qi[0] * kv[j][0];
        for (int c = 1; c < C; ++c) s += qi[c] * kv[j][c];
        part[j] = s;
      }
      scores[i * kMaxBlocks + blk] = visible[blk] ? sum_lanes(part) : splat(kNoScore);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {  // weights: exp(score - max), 0 where not visible
    f16v* si = &scores[i * kMaxBlocks];
    f16v top = splat(kNoScore);
    for (int64_t blk = 0; blk < blocks; ++blk)
      if (seen[blk]) top = si[blk] > top ? si[blk] : top;
    const float best = hmax(top);
    f16v total = {};
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const f16v p = seen[blk] ? exp16(si[blk] - best) : f16v{};
      si[blk] = visible[blk] ? p : f16v{};
#if defined(__AVX512BF16__)
      if (pairs) si[blk] = round_bf16(si[blk]);
#endif
      total += si[blk];
    }
    const int64_t slot = item.first_query + i;
    part_max[slot] = best;
    part_sum[slot] = hsum(total);
  }
#if defined(HEARTH_AMX)
  if constexpr (kPairs) {
    if (tiles) {
      values_amx<C>(item, scores.data(), kMaxBlocks, seen, blocks, nq, acc.data());
      blocks_done = true;
    }
  }
#endif
  for (int64_t blk = 0; blk < blocks && !blocks_done; ++blk) {  // outputs
    if (!seen[blk]) continue;
    const int64_t t = item.t0 + blk * kLanes, n = std::min<int64_t>(kLanes, item.t1 - t);
#if defined(__AVX512BF16__)
    if constexpr (kPairs) {
      if (pairs) {
        pair_values<C>(item.v + t * item.v_step, item.v_step, n, &scores[blk], kMaxBlocks, nq,
                       acc.data());
        continue;
      }
    }
#endif
    for (int64_t j = 0; j < kLanes; ++j) {  // past the end: zeros (weight 0, never NaN)
      const T* vr = item.v + (t + std::min<int64_t>(j, n - 1)) * item.v_step;
      for (int c = 0; c < C; ++c) kv[j][c] = j < n ? load16(vr + c * kLanes) : f16v{};
    }
    for (int64_t i = 0; i < nq; ++i) {
      const f16v p = scores[i * kMaxBlocks + blk];
      // Two sums per vector (even and odd keys): twice the independent chains of adds.
      f16v o[C], e[C] = {};
      for (int c = 0; c < C; ++c) o[c] = acc[i * C + c];
      for (int j = 0; j < kLanes; j += 2) {
        const float pj = p[j], pk = p[j + 1];
        for (int c = 0; c < C; ++c) {
          o[c] += pj * kv[j][c];
          e[c] += pk * kv[j + 1][c];
        }
      }
      for (int c = 0; c < C; ++c) acc[i * C + c] = o[c] + e[c];
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t slot = item.first_query + i;
#if defined(__AVX512BF16__)
    if (pairs) {
      unpair<C>(&acc[i * C], part_out + slot * D);
      continue;
    }
#endif
    for (int c = 0; c < C; ++c) store(part_out + slot * D + c * kLanes, acc[i * C + c]);
  }
}

template <typename T>
at::Tensor decode_attention_typed(const at::Tensor& query, const at::Tensor& own_k,
                                  const at::Tensor& own_v,
                                  const c10::optional<at::Tensor>& own_keep,
                                  const std::vector<at::Tensor>& part_k,
                                  const std::vector<at::Tensor>& part_v,
                                  const std::vector<c10::optional<at::Tensor>>& part_rows,
                                  double scale) {
  const int64_t rows = query.size(0), heads = query.size(1), d = query.size(2);
  const int64_t kv_heads = own_k.size(1), groups = heads / kv_heads, own_len = own_k.size(2);

  // Queries in float32, pre-scaled: [rows * heads, D]; query (b, h) is b * heads + h.
  std::vector<float> qf(rows * heads * d);
  const T* qsrc = query.data_ptr<T>();
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t x = 0; x < d; ++x)
        qf[(b * heads + h) * d + x] =
            static_cast<float>(qsrc[b * query.stride(0) + h * query.stride(1) + x]) *
            static_cast<float>(scale);
  // bfloat16 queries as they are (unscaled), for the keys' bfloat16 dot products.
  std::vector<uint16_t> qbits;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same<T, c10::BFloat16>::value) {
    qbits.resize(rows * heads * d);
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(&qbits[(b * heads + h) * d], qsrc + b * query.stride(0) + h * query.stride(1),
                    d * sizeof(uint16_t));
  }
#endif
  std::vector<Item<T>> items;
  std::vector<int64_t> query_ids;  // the item-query table
  // AMX tiles take 16 queries: more readers of a slice make several items of it.
  const bool tiles = !qbits.empty() && d % 32 == 0 && amx::on();
  const size_t most = tiles ? amx::kRows : SIZE_MAX;
  auto add_items = [&](const T* k, const T* v, int64_t k_head, int64_t v_head, int64_t k_step,
                       int64_t v_step, int64_t length, const bool* keep,
                       const std::vector<int64_t>& readers) {
    std::vector<int64_t> ids;
    for (int64_t h = 0; h < kv_heads; ++h) {
      ids.clear();
      for (int64_t b : readers)
        for (int64_t g = 0; g < groups; ++g) ids.push_back(b * heads + h * groups + g);
      for (int64_t t0 = 0; t0 < length; t0 += kSlice) {
        for (size_t q0 = 0; q0 < ids.size(); q0 += most) {
          const size_t q1 = std::min(ids.size(), q0 + most);
          items.push_back({k + h * k_head, v + h * v_head, k_step, v_step, t0,
                           std::min(length, t0 + kSlice), keep,
                           static_cast<int64_t>(query_ids.size()), static_cast<int64_t>(q1 - q0)});
          query_ids.insert(query_ids.end(), ids.begin() + q0, ids.begin() + q1);
        }
      }
    }
  };

  at::Tensor keep;
  if (own_keep.has_value()) keep = own_keep->to(at::kBool).contiguous();
  const T* ok = own_k.data_ptr<T>();
  const T* ov = own_v.data_ptr<T>();
  for (int64_t b = 0; b < rows; ++b) {
    const bool* row_keep = keep.defined() ? keep.data_ptr<bool>() + b * own_len : nullptr;
    add_items(ok + b * own_k.stride(0), ov + b * own_v.stride(0), own_k.stride(1), own_v.stride(1),
              own_k.stride(2), own_v.stride(2), own_len, row_keep, {b});
  }
  std::vector<int64_t> all_rows(rows);
  for (int64_t b = 0; b < rows; ++b) all_rows[b] = b;
  for (size_t p = 0; p < part_k.size(); ++p) {
    const at::Tensor& k = part_k[p];
    const at::Tensor& v = part_v[p];
    std::vector<int64_t> readers = all_rows;
    if (part_rows[p].has_value()) {  // the rows listed, none when empty (as torch's path)
      at::Tensor listed = part_rows[p]->to(at::kLong).contiguous();
      readers.assign(listed.data_ptr<int64_t>(), listed.data_ptr<int64_t>() + listed.numel());
      for (int64_t b : readers)
        TORCH_CHECK(b >= 0 && b < rows, "prefix part row ", b, " out of range");
    }
    if (readers.empty()) continue;
    add_items(k.data_ptr<T>(), v.data_ptr<T>(), k.stride(0), v.stride(0), k.stride(1), v.stride(1),
              k.size(1), nullptr, readers);
  }

  const int64_t slots = static_cast<int64_t>(query_ids.size());
  std::vector<float> part_max(slots), part_sum(slots), part_out(slots * d);
  const float* qdata = qf.data();
  const uint16_t* qb = qbits.empty() ? nullptr : qbits.data();
  const float fscale = static_cast<float>(scale);
  void (*run)(const Item<T>&, const float*, const uint16_t*, bool, float, const int64_t*, float*,
              float*, float*) = nullptr;
  switch (d) {
    case 16:
      run = run_item<T, 1>;
      break;
    case 32:
      run = run_item<T, 2>;
      break;
    case 64:
      run = run_item<T, 4>;
      break;
    case 96:
      run = run_item<T, 6>;
      break;
    case 128:
      run = run_item<T, 8>;
      break;
    case 256:
      run = run_item<T, 16>;
      break;
    default:
      TORCH_CHECK(false, "decode attention takes head sizes 16, 32, 64, 96, 128 or 256, not ", d);
  }
  auto run_range = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      run(items[i], qdata, qb, tiles, fscale, query_ids.data(), part_max.data(),
          part_sum.data(), part_out.data());
#if defined(HEARTH_AMX)
    if (tiles) amx::release();  // this thread's tiles: nothing left to save
#endif
  };
  // Waking the thread pool costs a few microseconds: a step over a short KV (a few
  // hundred key-query pairs per head) runs on the calling thread.
  int64_t pairs = 0;
  for (const Item<T>& item : items) pairs += (item.t1 - item.t0) * item.queries;
  const int64_t count = static_cast<int64_t>(items.size());
  if (pairs < kSerialPairs || count == 1) {
    run_range(0, count);
  } else {
    at::parallel_for(0, count, 1, run_range);
  }

  // Merge every query's partials: out = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i.
  std::vector<float> best(rows * heads, kNoScore), denom(rows * heads, 0.0f);
  std::vector<float> merged(rows * heads * d, 0.0f);
  for (int64_t s = 0; s < slots; ++s) {
    if (part_sum[s] > 0.0f) best[query_ids[s]] = std::max(best[query_ids[s]], part_max[s]);
  }
  for (int64_t s = 0; s < slots; ++s) {
    if (part_sum[s] <= 0.0f) continue;
    const int64_t q = query_ids[s];
    const float w = exp16(splat(part_max[s] - best[q]))[0];
    denom[q] += w * part_sum[s];
    float* out = merged.data() + q * d;
    const float* src = part_out.data() + s * d;
    for (int64_t x = 0; x < d; ++x) out[x] += w * src[x];
  }
  at::Tensor result = at::empty({rows, heads, d}, query.options());
  T* dst = result.data_ptr<T>();
  for (int64_t q = 0; q < rows * heads; ++q) {
    const float inv = denom[q] > 0.0f ? 1.0f / denom[q] : 0.0f;
    for (int64_t x = 0; x < d; ++x) dst[q * d + x] = static_cast<T>(merged[q * d + x] * inv);
  }
  return result;
}

void check_kv(const at::Tensor& t, int64_t dims, const at::Tensor& query, const char* what) {
  TORCH_CHECK(t.dim() == dims, what, " must have ", dims, " dimensions");
  TORCH_CHECK(t.scalar_type() == query.scalar_type(), what, " must have the query's dtype");
  TORCH_CHECK(t.size(dims - 1) == query.size(2), what, " has another head size");
  TORCH_CHECK(t.stride(dims - 1) == 1, what, " must be contiguous in its last dimension");
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
}

}  // namespace

namespace hearth {

bool use_attention_amx(bool on) {
  amx::wanted.store(on, std::memory_order_relaxed);
  return amx::on();
}

bool attention_amx() { return amx::on(); }

// query [B, Hq, D]; own_k/own_v [B, Hkv, S, D]; own_keep [B, S] bool or None;
// part_k/part_v [Hkv, T, D] each; part_rows: int64 row indices (empty: no row), or None
// for all rows. Everything is checked here (a Python error, never a crash): the device,
// dtypes, the strides the loops assume, and that heads and head size are not 0.
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& own_k,
                            const at::Tensor& own_v, const c10::optional<at::Tensor>& own_keep,
                            const std::vector<at::Tensor>& part_k,
                            const std::vector<at::Tensor>& part_v,
                            const std::vector<c10::optional<at::Tensor>>& part_rows,
                            double scale) {
  TORCH_CHECK(query.device().is_cpu(), "query must be on the CPU");
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1,
              "query must be [B, Hq, D], rows contiguous");
  TORCH_CHECK(query.size(1) > 0 && query.size(2) > 0, "query heads and head size must not be 0");
  check_kv(own_k, 4, query, "own keys");
  check_kv(own_v, 4, query, "own values");
  TORCH_CHECK(own_k.size(0) == query.size(0) && own_v.sizes() == own_k.sizes(),
              "own KV must be [B, Hkv, S, D]");
  TORCH_CHECK(own_k.size(1) > 0, "own KV must have at least one head");
  TORCH_CHECK(query.size(1) % own_k.size(1) == 0, "query heads must be a multiple of KV heads");
  if (own_keep.has_value()) {
    TORCH_CHECK(own_keep->device().is_cpu(), "the padding mask must be on the CPU");
    TORCH_CHECK(own_keep->dim() == 2 && own_keep->size(0) == query.size(0) &&
                    own_keep->size(1) == own_k.size(2),
                "the padding mask must be [B, S]");
  }
  TORCH_CHECK(part_k.size() == part_v.size() && part_k.size() == part_rows.size(),
              "one key, value and row list per prefix part");
  for (const c10::optional<at::Tensor>& listed : part_rows) {
    if (!listed.has_value()) continue;
    TORCH_CHECK(listed->device().is_cpu() && listed->dim() == 1 &&
                    at::isIntegralType(listed->scalar_type(), /*includeBool=*/false),
                "prefix part rows must be a 1-D integer tensor on the CPU");
  }
  for (size_t p = 0; p < part_k.size(); ++p) {
    check_kv(part_k[p], 3, query, "prefix keys");
    check_kv(part_v[p], 3, query, "prefix values");
    TORCH_CHECK(part_k[p].size(0) == own_k.size(1) && part_v[p].sizes() == part_k[p].sizes(),
                "prefix KV must be [Hkv, T, D]");
  }
  switch (query.scalar_type()) {
    case at::kBFloat16:
      return decode_attention_typed<c10::BFloat16>(query, own_k, own_v, own_keep, part_k, part_v,
                                                   part_rows, scale);
    case at::kHalf:
      return decode_attention_typed<c10::Half>(query, own_k, own_v, own_keep, part_k, part_v,
                                               part_rows, scale);
    case at::kFloat:
      return decode_attention_typed<float>(query, own_k, own_v, own_keep, part_k, part_v, part_rows,
                                           scale);
    default:
      TORCH_CHECK(false, "decode attention takes bfloat16, float16 or float32, not ",
                  query.scalar_type());
  }
}

}  // namespace hearth
