// The vocabulary of quant_linear.cpp and its instruction-set paths (quant_avx512.h,
// quant_avx2.h, quant_neon.h): the tile layout's shape, a tile's scales and zeros, the
// 16-feature lanes of a step, and rows quantized per group for the integer path. See
// quant_linear.cpp's header for the layout.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "vec.h"

namespace hearth::quant {

using hearth::vec::f16v;
using hearth::vec::i16v;
using hearth::vec::u16v;

constexpr int64_t kLanes = 16;

// The 4 bytes at p as one 32-bit word (4 int8 inputs, or a lane's 4 codes).
inline int32_t word_at(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}


struct Shape {
  int64_t n, k, k_pad, group, groups, bits, tile_bytes;
};

inline Shape shape_of(int64_t n, int64_t k, int64_t group, int64_t bits) {
  const int64_t k_pad = (k + group - 1) / group * group;
  return {n, k, k_pad, group, k_pad / group, bits, k_pad * kLanes * bits / 8};
}

inline f16v halfs_to_float(const at::Half* p) {
  f16v out;
#if defined(__AVX512F__)  // one instruction; c10::Half's conversion is scalar code
  const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  std::memcpy(&out, &wide, sizeof(out));
#elif defined(__F16C__)  // two (AVX2 hosts)
  const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  std::memcpy(&out, &a, sizeof(a));
  std::memcpy(reinterpret_cast<char*>(&out) + sizeof(a), &b, sizeof(b));
#else
  for (int i = 0; i < kLanes; ++i) out[i] = static_cast<float>(p[i]);
#endif
  return out;
}

inline f16v int8s_to_float(const int8_t* p) {
  f16v out;
#if defined(__AVX512F__)
  const __m512 wide = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&out, &wide, sizeof(out));
#else
  for (int i = 0; i < kLanes; ++i) out[i] = static_cast<float>(p[i]);
#endif
  return out;
}

// One tile's group scales and zeros (see the layout above): float16 per group, or int8
// factors per group times the float16 super-scales of their super-block.
struct Params {
  const at::Half* s = nullptr;  // float16 [G, 16]
  const at::Half* z = nullptr;
  const int8_t* sf = nullptr;  // int8 [G, 16] (two-level)
  const int8_t* zf = nullptr;
  const at::Half* sup = nullptr;  // float16 [GS, Z, 16]
  int64_t per = 0, zn = 1;  // groups per super-block (0: one level), Z
  // This tile's scales and zeros (scale(g), zero(g)) widened to float32 once, [G][2][16],
  // where AVX2's integer path reads them for several pairs of rows (quant_linear.cpp).
  const float* wide = nullptr;

  bool has_zero() const { return z != nullptr || zf != nullptr; }
  // Super-block b's float16 super-scale and super-zero (two levels only).
  f16v super_scale(int64_t b) const { return halfs_to_float(sup + b * zn * kLanes); }
  f16v super_zero(int64_t b) const { return halfs_to_float(sup + (b * zn + 1) * kLanes); }
  f16v scale(int64_t g) const {
    if (per == 0) return halfs_to_float(s + g * kLanes);
    return int8s_to_float(sf + g * kLanes) * super_scale(g / per);
  }
  f16v zero(int64_t g) const {
    if (!has_zero()) return f16v{};
    if (per == 0) return halfs_to_float(z + g * kLanes);
    return int8s_to_float(zf + g * kLanes) * super_zero(g / per);
  }
  float scale_at(int64_t g, int64_t lane) const {
    if (per == 0) return static_cast<float>(s[g * kLanes + lane]);
    return static_cast<float>(sf[g * kLanes + lane]) *
           static_cast<float>(sup[(g / per) * zn * kLanes + lane]);
  }
  float zero_at(int64_t g, int64_t lane) const {
    if (!has_zero()) return 0.0f;
    if (per == 0) return static_cast<float>(z[g * kLanes + lane]);
    return static_cast<float>(zf[g * kLanes + lane]) *
           static_cast<float>(sup[((g / per) * zn + 1) * kLanes + lane]);
  }
  // Tile t's parameters (this one describes tile 0).
  Params tile(int64_t t, int64_t groups) const {
    Params p = *this;
    const int64_t stride = groups * kLanes;
    if (per == 0) {
      p.s = s + t * stride;
      p.z = z != nullptr ? z + t * stride : nullptr;
    } else {
      p.sf = sf + t * stride;
      p.zf = zf != nullptr ? zf + t * stride : nullptr;
      p.sup = sup + t * ((groups + per - 1) / per) * zn * kLanes;
    }
    return p;
  }
};

inline u16v load_u(const uint8_t* p) {
  u16v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Input i (0..3) of the step in each feature's 32-bit lane, as int32: 4-bit lanes are
// already nibbles (unsigned); 8-bit lanes are signed bytes.
template <int Bits>
inline i16v lane_input(u16v lanes, int i) {
  if constexpr (Bits == 4) {
    return (i16v)((lanes >> (8 * i)) & 0xFFu);
  } else {
    return ((i16v)(lanes << (24 - 8 * i))) >> 24;
  }
}

// The stored 6-bit codes (0..63) of step s (0..3) of a 16-input block: the low nibbles
// of pair s / 2 (s odd: the high ones), the top two bits from the crumbs' bits 2s.
inline u16v six_step(const uint8_t* block, int s) {
  const u16v lo = load_u(block + (s / 2) * 64), hb = load_u(block + 128);
  return ((lo >> (4 * (s % 2))) & 0x0F0F0F0Fu) | (((hb >> (2 * s)) & 0x03030303u) << 4);
}

// Rows quantized per group for the integer path: int8 values (and +128 as uint8 for the
// 8-bit weights, whose operand must be the signed one), a float scale and the float sum.
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<uint8_t> u;  // only for 8-bit weights
  std::vector<float> scale, sum;
  std::vector<int32_t> qsum;  // per group, the int8 inputs' sum (6-bit codes' offset)

  void add_unsigned() {  // u from q, for 8-bit weights
    u.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) u[i] = static_cast<uint8_t>(q[i] + 128);
  }
};

}  // namespace hearth::quant
