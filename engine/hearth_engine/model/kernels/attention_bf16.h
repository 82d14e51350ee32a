// decode_attention.cpp's path for bfloat16 KV on CPUs with AVX512-BF16 (see that file's
// header): scores and weighed values by VDPBF16PS, pairs of bfloat16 multiplied into
// float32 lanes, no key or value widened.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

#include "vec.h"

namespace hearth::attention {

constexpr float kNoScore = -1e30f;  // the score of a key a query does not see

}  // namespace hearth::attention

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace hearth::attention::bf16 {

using namespace hearth::vec;  // NOLINT(build/namespaces): the kernels' vocabulary

// bfloat16 keys with AVX512-BF16: the scores of one block of keys (kv: its keys, each as
// C / 2 raw vectors of 32 bfloat16, in kBitrev order) for every query of the item, from the
// queries' own bfloat16 values (qb, unscaled) by VDPBF16PS: each product of two bfloat16
// is exact in float32, as the float path's, and no key is widened. Then times scale.
template <int C>
inline void bf16_scores(const __m512i (*kv)[C / 2], const uint16_t* qb, const int64_t* ids,
                        int64_t nq, float scale, i16v visible, f16v* scores, int64_t stride) {
  for (int64_t i = 0; i < nq; ++i) {
    const uint16_t* qi = qb + ids[i] * C * kLanes;
    __m512bh q[C / 2];
    for (int c = 0; c < C / 2; ++c) {
      const __m512i raw = _mm512_loadu_si512(qi + c * 2 * kLanes);
      std::memcpy(&q[c], &raw, sizeof(raw));
    }
    f16v part[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (int c = 0; c < C / 2; ++c) {
        __m512bh k;
        std::memcpy(&k, &kv[j][c], sizeof(k));
        acc = _mm512_dpbf16_ps(acc, q[c], k);
      }
      std::memcpy(&part[j], &acc, sizeof(acc));
    }
    scores[i * stride] = visible ? sum_lanes(part) * scale : splat(kNoScore);
  }
}

// The values of one block of keys (rows v, v_step apart, n of them) weighed for every
// query, two keys a step: rows j and j + 1 interleaved (vpunpck{l,h}wd) are the pairs
// VDPBF16PS multiplies by the pair of the two keys' weights (already bfloat16: see
// round_bf16). Within each 128-bit lane the low unpack holds dims 0-3 and the high dims
// 4-7, so each query's accumulators (acc: C vectors per query) are in that order until
// unpair puts them back.
template <int C>
inline void pair_values(const c10::BFloat16* v, int64_t v_step, int64_t n, const f16v* weights,
                        int64_t stride, int64_t nq, f16v* acc) {
  __m512i pairs[kLanes / 2][C];
  const __m512i zero = _mm512_setzero_si512();
  for (int j = 0; j < kLanes; j += 2) {  // past the end: zeros (weight 0, never NaN)
    for (int c = 0; c < C / 2; ++c) {
      const __m512i a = j < n ? _mm512_loadu_si512(v + j * v_step + c * 2 * kLanes) : zero;
      const __m512i b =
          j + 1 < n ? _mm512_loadu_si512(v + (j + 1) * v_step + c * 2 * kLanes) : zero;
      pairs[j / 2][2 * c] = _mm512_unpacklo_epi16(a, b);
      pairs[j / 2][2 * c + 1] = _mm512_unpackhi_epi16(a, b);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    __m512 w;
    std::memcpy(&w, &weights[i * stride], sizeof(w));
    const __m256bh wb = _mm512_cvtneps_pbh(w);  // exact: the weights are bfloat16 values
    alignas(32) int32_t words[kLanes / 2];      // word m: keys 2m (low half) and 2m + 1
    std::memcpy(words, &wb, sizeof(words));
    __m512 o[C];
    std::memcpy(o, &acc[i * C], sizeof(o));
    for (int m = 0; m < kLanes / 2; ++m) {
      const __m512i both = _mm512_set1_epi32(words[m]);
      __m512bh wm;
      std::memcpy(&wm, &both, sizeof(wm));
      for (int c = 0; c < C; ++c) {
        __m512bh vm;
        std::memcpy(&vm, &pairs[m][c], sizeof(vm));
        o[c] = _mm512_dpbf16_ps(o[c], vm, wm);
      }
    }
    std::memcpy(&acc[i * C], o, sizeof(o));
  }
}

// pair_values' accumulators in dims order: per 32 dims, lanes of the low vector are dims
// 0-3, 8-11, 16-19, 24-27 and of the high one 4-7, 12-15, 20-23, 28-31.
template <int C>
inline void unpair(const f16v* acc, float* out) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int c = 0; c < C / 2; ++c) {
    __m512 lo, hi;
    std::memcpy(&lo, &acc[2 * c], sizeof(lo));
    std::memcpy(&hi, &acc[2 * c + 1], sizeof(hi));
    _mm512_storeu_ps(out + c * 2 * kLanes, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(out + c * 2 * kLanes + kLanes, _mm512_permutex2var_ps(lo, second, hi));
  }
}

// Weights rounded to bfloat16 (and back), for the values' VDPBF16PS: the sum of the
// weights then adds the very weights the values are multiplied by.
inline f16v round_bf16(f16v v) {
  __m512 x;
  std::memcpy(&x, &v, sizeof(x));
  const __m256bh b = _mm512_cvtneps_pbh(x);
  __m256i raw;
  std::memcpy(&raw, &b, sizeof(raw));
  const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  f16v out;
  std::memcpy(&out, &back, sizeof(out));
  return out;
}

}  // namespace hearth::attention::bf16
#endif
