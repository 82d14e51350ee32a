// Decode attention's two products on AMX tiles (decode_attention.cpp's bfloat16 path on a
// CPU with AMX-BF16): the scores of 16 keys for up to 16 queries, and the values weighed
// by up to 16 queries' softmax weights.
//
// Why: on a 2-vCPU Xeon VM one VDPBF16PS took 0.92 ns and the vector kernel spent 11.1 ns
// a query-key pair at head size 128 (8 VDPBF16PS a pair: two thirds of it), so a house of
// 6,300 keys read at 8-14 GB/s: compute-bound where the memory gives 24-27. One
// TDPBF16PS (16 x 16 x 32 products) took 5.9 ns: 1,400 products a nanosecond against 35.
//
// * Scores: S^T [16 keys, 16 queries] = K [16 keys, 32 dims] x Q^T, 32 dims at a time. The
//   keys are the A tile, loaded straight from the KV rows (their stride); Q^T is the B
//   tile in the pair layout AMX wants (row p: every query's dims 2p and 2p + 1), built once
//   per work item. Each product of two bfloat16 is exact in float32, as in the vector path;
//   the sums run in another order (float32 rounding apart, the same scores).
// * Values: O [16 queries, 16 dims] += P [16 queries, 32 keys] x V [32 keys, 16 dims]: P is
//   the softmax weights (already bfloat16 values), V's B tile pairs keys 2r and 2r + 1 row
//   by row (vpunpck{l,h}wd of the two rows, as the vector path's pair_values), so its 16
//   columns are the dims in that order and ``unpair`` puts them back.
//
// The tiles' configuration is per thread: ``configure`` before a work item's products,
// ``release`` when a thread's range is done (so a context switch saves no tile data).
// ``ready`` asks Linux once for this process's permission to use the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM); refused, or not built with AMX, the vector path serves.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__linux__) && !defined(HEARTH_NO_AMX)
#define HEARTH_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace hearth::amx {

constexpr int kRows = 16;        // keys of a score tile, queries of every tile
constexpr int kPairKeys = 32;    // keys of one values product (16 pairs)
constexpr int kTileBytes = 1024; // 16 rows of 64 bytes
constexpr int kTileWords = 256;  // 32-bit elements of a tile (16 x 16)

#if defined(HEARTH_AMX)

inline bool ask_permission() {
  constexpr long kReqPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kTileData = 18;     // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kReqPerm, kTileData) == 0;
}

// Whether this build has the tiles and the OS lets this process use them (asked once).
inline bool ready() {
  static const bool ok = ask_permission();
  return ok;
}

// hearth::use_attention_amx's choice, read by decode and prefix attention alike.
inline std::atomic<bool> wanted{true};

// Whether attention's bfloat16 products run on the tiles now.
inline bool on() { return wanted.load(std::memory_order_relaxed) && ready(); }

struct alignas(64) Config {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows of 64 bytes (this thread).
inline void configure() {
  Config cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kRows;
    cfg.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

inline void release() { _tile_release(); }

// Q^T as B tiles, one per 32 dims: qt[c][p][q] (32 bits) = query q's dims 32c + 2p and
// 32c + 2p + 1 (bfloat16 bits, the even dim low), 0 for q >= nq. rows[q]: D bfloat16.
inline void pack_queries(const uint16_t* const* rows, int64_t nq, int64_t d, uint32_t* qt) {
  std::memset(qt, 0, d / 32 * kTileBytes);
  for (int64_t q = 0; q < nq; ++q) {
    for (int64_t j = 0; j < d / 2; ++j) {
      uint32_t pair;
      std::memcpy(&pair, rows[q] + 2 * j, sizeof(pair));
      qt[(j / 16) * kTileWords + (j % 16) * kRows + q] = pair;
    }
  }
}

// One block's scores: st [16 keys][16 queries] float32 = K x Q^T for the 16 key rows at k
// (k_step elements apart; all 16 must be readable: a short block comes from a zeroed
// copy), d / 32 products.
inline void scores(const uint16_t* k, int64_t k_step, const uint32_t* qt, int64_t d, float* st) {
  _tile_zero(0);
  for (int64_t c = 0; c < d / 32; ++c) {
    _tile_loadd(1, k + c * 32, k_step * 2);
    _tile_loadd(2, qt + c * kTileWords, 64);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, st, 64);
}

// V's B tiles for 32 keys from v (rows v_step elements apart; only rows [first, n) are
// read, the others are zeros), dims [32 c0, 32 c1): vb[c - c0][h] for each 32 dims c and
// half h, row r = keys 2r and 2r + 1 interleaved.
inline void pack_values(const uint16_t* v, int64_t v_step, int64_t first, int64_t n, int64_t c0,
                        int64_t c1, uint16_t* vb) {
  const __m512i zero = _mm512_setzero_si512();
  const auto row = [&](int64_t j, int64_t c) {
    return j >= first && j < n ? _mm512_loadu_si512(v + j * v_step + c * 32) : zero;
  };
  for (int64_t r = 0; r < kPairKeys / 2; ++r) {
    const int64_t j = 2 * r;
    for (int64_t c = c0; c < c1; ++c) {
      const __m512i a = row(j, c), b = row(j + 1, c);
      uint16_t* lo = vb + ((c - c0) * 2) * (kTileBytes / 2) + r * 32;
      _mm512_storeu_si512(lo, _mm512_unpacklo_epi16(a, b));
      _mm512_storeu_si512(lo + kTileBytes / 2, _mm512_unpackhi_epi16(a, b));
    }
  }
}

// Where the 32 keys of group g start, which of them are read (``pack_values``'s first
// and n), for ``values``.
struct KeyGroup {
  const uint16_t* v;
  int64_t first, n;
};

// out [d / 16][16 queries][16] float32 = sum over the groups of P x V: p[g] the A tile of
// group g (16 queries x 32 keys, bfloat16). Four output tiles at a time stay in tiles 0-3
// over every group (A in 4, B in 5), their V tiles packed group by group into vb (two
// buffers of 4 tiles, alternated).
inline void values(const uint16_t* p, const KeyGroup* groups, int64_t count, int64_t v_step,
                   int64_t d, uint16_t* vb, float* out) {
  constexpr int64_t kElems = kTileBytes / 2;
  for (int64_t t0 = 0; t0 < d / 16; t0 += 4) {
    const int64_t tn = std::min<int64_t>(4, d / 16 - t0);  // 2 or 4 (d a multiple of 32)
    _tile_zero(0);
    _tile_zero(1);
    if (tn > 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t g = 0; g < count; ++g) {
      uint16_t* b = vb + (g % 2) * 4 * kElems;
      pack_values(groups[g].v, v_step, groups[g].first, groups[g].n, t0 / 2, (t0 + tn) / 2, b);
      _tile_loadd(4, p + g * kElems, 64);
      _tile_loadd(5, b, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(5, b + kElems, 64);
      _tile_dpbf16ps(1, 4, 5);
      if (tn > 2) {
        _tile_loadd(5, b + 2 * kElems, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(5, b + 3 * kElems, 64);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
    _tile_stored(0, out + t0 * kTileWords, 64);
    _tile_stored(1, out + (t0 + 1) * kTileWords, 64);
    if (tn > 2) {
      _tile_stored(2, out + (t0 + 2) * kTileWords, 64);
      _tile_stored(3, out + (t0 + 3) * kTileWords, 64);
    }
  }
}

#else

inline bool ready() { return false; }
inline std::atomic<bool> wanted{true};
inline bool on() { return false; }

#endif

}  // namespace hearth::amx
