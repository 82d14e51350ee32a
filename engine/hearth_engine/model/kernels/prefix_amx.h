// Prefix attention's two products on AMX tiles (prefix_attention.cpp's path on a CPU with
// AMX-BF16): a warm prefill's queries over a cached part, 16 queries to a tile.
//
// Why: torch's flash kernel already multiplies in AMX tiles on such a CPU, yet on a
// 2-vCPU Xeon it ran the default model's 100 warm tokens over the 6,300-token house at
// about 300-400 GFLOP/s, where one TDPBF16PS (16 x 16 x 32 products) took 5 ns. On that
// VM a tile load (1 KB) took 16 ns and a tile store 10, so these loops are written for
// loads: each product loads at most one tile, and a score tile is stored whole.
//
// * Scores: S [16 queries, 16 keys] = Q [16 queries, 32 dims] x K^T, 32 dims at a time.
//   Q is the A tile (its rows packed once per call, kept loaded over the key blocks); K^T
//   is the B tile in the pair layout AMX wants (row p: dims 2p and 2p + 1 of each of 16
//   keys), made once per work item by a 16 x 16 transpose of 32-bit words
//   (``pack_keys``) and read by every query block. Each product of two bfloat16 is exact
//   in float32, as in the vector path.
// * Values: O [16 queries, 16 dims] += P [16 queries, 32 keys] x V [32 keys, 16 dims]: P
//   is the softmax weights, rounded to bfloat16 in key order (prefix_attention.cpp's
//   ``weigh`` writes them as A tiles), and V's B tiles pair keys 2r and 2r + 1 dim by dim
//   (``pack_values``, once per work item). Two query blocks at a time, so that each P and
//   V tile serves two products.
//
// Tile numbers are instruction immediates, so the products are written out per head size
// (32 and 64; 128; any). The caller configures the tiles (attention_amx.h) and releases
// them when its thread's work is done.
#pragma once

#include <cstdint>

#include "attention_amx.h"

namespace hearth::amx::prefix {

#if defined(HEARTH_AMX)

constexpr int64_t kElems = kTileBytes / 2;  // bfloat16 elements of a tile

// Words (t, p) -> (p, t) of a 16 x 16 matrix of 32-bit words, one row per register.
inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {  // lane L: rows 2i, 2i + 1 at columns 4L .. 4L + 3
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + e], lane L: rows 4i .. 4i + 3 at column 4L + e
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  __m512i out[16];
  for (int e = 0; e < 4; ++e) {  // column 4L + e: lane L of r[e], r[4 + e], r[8 + e], r[12 + e]
    const __m512i ab_lo = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44);
    const __m512i ab_hi = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
    const __m512i cd_lo = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44);
    const __m512i cd_hi = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
    out[e] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88);
    out[4 + e] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
    out[8 + e] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88);
    out[12 + e] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = out[i];
}

// Q's A tiles: qa[(block * d / 32 + c) * kElems + i * 32 + x] = query 16 block + i's dim
// 32 c + x; rows past n are 0. q: n rows `step` elements apart.
inline void pack_queries(const uint16_t* q, int64_t step, int64_t n, int64_t d, uint16_t* qa) {
  const int64_t cs = d / 32, blocks = (n + kRows - 1) / kRows;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < cs; ++c)
      for (int64_t i = 0; i < kRows; ++i) {
        uint16_t* dst = qa + (b * cs + c) * kElems + i * 32;
        const int64_t row = b * kRows + i;
        if (row < n) {
          std::memcpy(dst, q + row * step + c * 32, 64);
        } else {
          std::memset(dst, 0, 64);
        }
      }
}

// K^T's B tiles: kt[(block * d / 32 + c) * kTileWords + p * 16 + j] = key 16 block + j's
// dims 32 c + 2p, 2p + 1 (one 32-bit word); keys past n are 0. k: rows `step` apart.
inline void pack_keys(const uint16_t* k, int64_t step, int64_t n, int64_t padded, int64_t d,
                      uint32_t* kt) {
  const int64_t cs = d / 32;
  __m512i r[16];
  for (int64_t b = 0; b < padded / kRows; ++b)
    for (int64_t c = 0; c < cs; ++c) {
      for (int64_t j = 0; j < kRows; ++j) {
        const int64_t key = b * kRows + j;
        r[j] = key < n ? _mm512_loadu_si512(k + key * step + c * 32) : _mm512_setzero_si512();
      }
      transpose16(r);
      uint32_t* dst = kt + (b * cs + c) * kTileWords;
      for (int64_t p = 0; p < kRows; ++p) _mm512_storeu_si512(dst + p * kRows, r[p]);
    }
}

// V's B tiles: vb[(group * d / 16 + t) * kElems + r * 32 + 2 x + s] = key 32 group + 2r +
// s's dim 16 t + x; keys past n are 0. v: rows `step` apart; padded a multiple of 32.
inline void pack_values(const uint16_t* v, int64_t step, int64_t n, int64_t padded, int64_t d,
                        uint16_t* vb) {
  alignas(64) static constexpr uint16_t kLow[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,
                                                    37, 6, 38, 7, 39, 8,  40, 9,  41, 10, 42,
                                                    11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i low = _mm512_load_si512(kLow);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  const int64_t ts = d / 16;
  for (int64_t g = 0; g < padded / 32; ++g)
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t key = g * 32 + 2 * r;
      const uint16_t* a = v + key * step;
      const uint16_t* b = v + (key + 1) * step;
      for (int64_t c = 0; c < d / 32; ++c) {
        const __m512i x = key < n ? _mm512_loadu_si512(a + c * 32) : _mm512_setzero_si512();
        const __m512i y = key + 1 < n ? _mm512_loadu_si512(b + c * 32) : _mm512_setzero_si512();
        uint16_t* dst = vb + (g * ts + 2 * c) * kElems + r * 32;
        _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(x, low, y));
        _mm512_storeu_si512(dst + kElems, _mm512_permutex2var_epi16(x, high, y));
      }
    }
}

// The scores of one query block come out as one tile per key block: s[(b * 16 + i) * 16 +
// j] for query i and key 16 b + j. Each tile is stored contiguously: rows 2 KB apart (a
// 512-key item's rows) fell into two of the L1 cache's sets and made every score tile's
// store half again as slow as its products.
constexpr int64_t kScoreTile = kRows * kRows;

// Key blocks b .. b + 3 (or + 1: Four false) with the query tiles resident in 4 (and 5:
// Cs 2), key tiles alternating in 6 and 7, accumulators 0-3. A macro: GCC's tile
// intrinsics paste their tile numbers into the assembly, so they must be literals.
#define HEARTH_SCORES_NARROW(FOUR)                                                   \
  do {                                                                               \
    const uint32_t* k = kt + b * Cs * kTileWords;                                    \
    float* out = s + b * kScoreTile;                                                 \
    _tile_zero(0);                                                                   \
    _tile_zero(1);                                                                   \
    if (FOUR) {                                                                      \
      _tile_zero(2);                                                                 \
      _tile_zero(3);                                                                 \
    }                                                                                \
    for (int c = 0; c < Cs; ++c) {                                                   \
      _tile_loadd(6, k + c * kTileWords, 64);                                        \
      if (c == 0) _tile_dpbf16ps(0, 4, 6); else _tile_dpbf16ps(0, 5, 6);             \
      _tile_loadd(7, k + (Cs + c) * kTileWords, 64);                                 \
      if (c == 0) _tile_dpbf16ps(1, 4, 7); else _tile_dpbf16ps(1, 5, 7);             \
      if (FOUR) {                                                                    \
        _tile_loadd(6, k + (2 * Cs + c) * kTileWords, 64);                           \
        if (c == 0) _tile_dpbf16ps(2, 4, 6); else _tile_dpbf16ps(2, 5, 6);           \
        _tile_loadd(7, k + (3 * Cs + c) * kTileWords, 64);                           \
        if (c == 0) _tile_dpbf16ps(3, 4, 7); else _tile_dpbf16ps(3, 5, 7);           \
      }                                                                              \
    }                                                                                \
    _tile_stored(0, out, 64);                                                        \
    _tile_stored(1, out + kScoreTile, 64);                                           \
    if (FOUR) {                                                                      \
      _tile_stored(2, out + 2 * kScoreTile, 64);                                     \
      _tile_stored(3, out + 3 * kScoreTile, 64);                                     \
    }                                                                                \
  } while (0)

// Scores of one query block against `blocks` key blocks (an even count), head size 32 Cs
// for Cs 1 or 2: the query tiles stay loaded, so each product loads one key tile.
template <int Cs>
inline void scores_narrow(const uint16_t* qa, const uint32_t* kt, int64_t blocks, float* s) {
  static_assert(Cs == 1 || Cs == 2, "head sizes 32 or 64");
  _tile_loadd(4, qa, 64);
  if constexpr (Cs == 2) _tile_loadd(5, qa + kElems, 64);
  int64_t b = 0;
  for (; b + 4 <= blocks; b += 4) HEARTH_SCORES_NARROW(true);
  if (b < blocks) HEARTH_SCORES_NARROW(false);
}

// The same for head size 128: the four query tiles stay in 4-7, the key tiles alternate in
// 2 and 3, and two accumulators (0, 1) take turns so that one is stored while the other
// multiplies.
inline void scores_128(const uint16_t* qa, const uint32_t* kt, int64_t blocks, float* s) {
  _tile_loadd(4, qa, 64);
  _tile_loadd(5, qa + kElems, 64);
  _tile_loadd(6, qa + 2 * kElems, 64);
  _tile_loadd(7, qa + 3 * kElems, 64);
  for (int64_t b = 0; b < blocks; b += 2) {
    const uint32_t* k = kt + b * 4 * kTileWords;
    float* out = s + b * kScoreTile;
    _tile_zero(0);
    _tile_loadd(2, k, 64);
    _tile_dpbf16ps(0, 4, 2);
    _tile_loadd(3, k + kTileWords, 64);
    _tile_dpbf16ps(0, 5, 3);
    _tile_loadd(2, k + 2 * kTileWords, 64);
    _tile_dpbf16ps(0, 6, 2);
    _tile_loadd(3, k + 3 * kTileWords, 64);
    _tile_dpbf16ps(0, 7, 3);
    _tile_stored(0, out, 64);
    _tile_zero(1);
    _tile_loadd(2, k + 4 * kTileWords, 64);
    _tile_dpbf16ps(1, 4, 2);
    _tile_loadd(3, k + 5 * kTileWords, 64);
    _tile_dpbf16ps(1, 5, 3);
    _tile_loadd(2, k + 6 * kTileWords, 64);
    _tile_dpbf16ps(1, 6, 2);
    _tile_loadd(3, k + 7 * kTileWords, 64);
    _tile_dpbf16ps(1, 7, 3);
    _tile_stored(1, out + kScoreTile, 64);
  }
}

// Any head size (256: eight query tiles do not fit beside the others): two key blocks at
// a time, the query tiles loaded again for each.
inline void scores_wide(const uint16_t* qa, const uint32_t* kt, int64_t d, int64_t blocks,
                        float* s) {
  const int64_t cs = d / 32;
  for (int64_t b = 0; b < blocks; b += 2) {
    const uint32_t* k = kt + b * cs * kTileWords;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t c = 0; c < cs; ++c) {
      _tile_loadd(4, qa + c * kElems, 64);
      _tile_loadd(5, k + c * kTileWords, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, k + (cs + c) * kTileWords, 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    _tile_stored(0, s + b * kScoreTile, 64);
    _tile_stored(1, s + (b + 1) * kScoreTile, 64);
  }
}

// One query block's scores (see kScoreTile for s's layout).
inline void scores(const uint16_t* qa, const uint32_t* kt, int64_t d, int64_t blocks,
                   float* s) {
  switch (d) {
    case 32:
      scores_narrow<1>(qa, kt, blocks, s);
      break;
    case 64:
      scores_narrow<2>(qa, kt, blocks, s);
      break;
    case 128:
      scores_128(qa, kt, blocks, s);
      break;
    default:
      scores_wide(qa, kt, d, blocks, s);
  }
}

// Outputs of two query blocks (32 queries): out[i * d + x] = sum over the groups of P x V
// for query i and dim x. p: the weights as A tiles, p[((block * groups + g) * 16 + i) * 32
// + j] for query 16 block + i and key 32 g + j; vb: pack_values' tiles. Two dim tiles at a
// time, in a 2 x 2 of accumulators (0-3), so that each load (P in 4-5, V in 6-7) serves
// two products.
inline void values_pair(const uint16_t* p, const uint16_t* vb, int64_t groups, int64_t d,
                        float* out) {
  const int64_t ts = d / 16, bytes = d * 4;
  const uint16_t* p2 = p + groups * kElems;
  float* out2 = out + kRows * d;
  for (int64_t t = 0; t < ts; t += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t* b = vb + (g * ts + t) * kElems;
      _tile_loadd(4, p + g * kElems, 64);
      _tile_loadd(6, b, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, p2 + g * kElems, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(7, b + kElems, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out + t * kRows, bytes);
    _tile_stored(1, out + (t + 1) * kRows, bytes);
    _tile_stored(2, out2 + t * kRows, bytes);
    _tile_stored(3, out2 + (t + 1) * kRows, bytes);
  }
}

#undef HEARTH_SCORES_NARROW

#endif  // HEARTH_AMX

}  // namespace hearth::amx::prefix
