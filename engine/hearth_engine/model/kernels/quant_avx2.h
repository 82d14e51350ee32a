// quant_linear.cpp's AVX2 paths: the group dot products (``HEARTH_QAVX2``), and the
// prefill's unpacking of codes to floats and scaled stores (where AVX-512 does not take
// them). The same arithmetic as the generic code (quant_generic.h, quant_dequant.h), bit
// for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant_common.h"
#include "vec.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif
// Where AVX-512 VNNI does not take them (quant_avx512.h): the dot products by AVX2.
#if defined(__AVX2__) && !(defined(__AVX512VNNI__) && defined(__AVX512BW__)) && \
    !defined(HEARTH_QUANT_GENERIC)
#define HEARTH_QAVX2 1
#endif

namespace hearth::quant_avx2 {

using hearth::vec::i16v;


#if defined(HEARTH_QAVX2)
// AVX2 has no vpdpbusd: vpmaddubsw multiplies unsigned by signed bytes into 16-bit sums
// of pairs, and vpmaddwd by ones adds those pairs into the same 32-bit lane sums (16
// features x 4 inputs, each 64-byte step as two 32-byte halves: features 0-7 and 8-15).
// 4-bit codes (0..15) times inputs (|x| <= 127) stay far inside int16: four steps add
// up in 16 bits (4 x 2 x 2 x 15 x 127 = 30,480) before one widening. 8-bit codes are
// signed: |w| goes in as the unsigned operand and x takes w's sign (vpsignb), so a pair
// is at most 2 x 128 x 127 = 32,512 (llama.cpp's q8 trick), widened every step.
inline __m256i bcast4_256(const int8_t* p) {
  return _mm256_set1_epi32(hearth::quant::word_at(p));
}

// Group dots of MB rows as two 8-lane halves each (features 0-7, 8-15).
template <int Bits, int MB>
inline void group_dots(const uint8_t* w, const int8_t* xq, int64_t k_pad, int64_t k0,
                       int64_t group, __m256i (&out)[MB][2]);

template <int Bits, int MB>
inline void group_dots(const uint8_t* w, const int8_t* xq, int64_t k_pad, int64_t k0,
                       int64_t group, i16v* dots) {
  __m256i out[MB][2];
  group_dots<Bits, MB>(w, xq, k_pad, k0, group, out);
  for (int m = 0; m < MB; ++m) {
    std::memcpy(&dots[m], &out[m][0], 32);
    std::memcpy(reinterpret_cast<char*>(&dots[m]) + 32, &out[m][1], 32);
  }
}

template <int Bits, int MB>
inline void group_dots(const uint8_t* w, const int8_t* xq, int64_t k_pad, int64_t k0,
                       int64_t group, __m256i (&out)[MB][2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  if constexpr (Bits == 4) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i part[MB][2];
    for (int64_t p = 0; p < group / 8; ++p) {
      if (p % 4 == 0)
        for (int m = 0; m < MB; ++m) part[m][0] = part[m][1] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * 64 + h * 32));
        const __m256i lo = _mm256_and_si256(raw, mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
        for (int m = 0; m < MB; ++m) {
          const int8_t* x = xq + m * k_pad + k0 + p * 8;
          const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4_256(x)),
                                             _mm256_maddubs_epi16(hi, bcast4_256(x + 4)));
          part[m][h] = _mm256_add_epi16(part[m][h], s);
        }
      }
      if (p % 4 == 3 || p + 1 == group / 8)
        for (int m = 0; m < MB; ++m)
          for (int h = 0; h < 2; ++h)
            acc[m][h] = _mm256_add_epi32(acc[m][h], _mm256_madd_epi16(part[m][h], ones));
    }
  } else if constexpr (Bits == 6) {
    // Stored codes 0..63: two steps add up in 16 bits (2 x 2 x 63 x 127 = 32,004).
    const __m256i mask = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
    for (int64_t j = 0; j < group / 16; ++j) {
      for (int h = 0; h < 2; ++h) {
        const uint8_t* blk = w + j * 192 + h * 32;
        const auto half = [&](int at) {
          return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + at));
        };
        const __m256i lo0 = half(0), lo1 = half(64), hb = half(128);
        const auto top = [&](int s) {
          return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * s), two), 4);
        };
        const __m256i st[4] = {
            _mm256_or_si256(_mm256_and_si256(lo0, mask), top(0)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), mask), top(1)),
            _mm256_or_si256(_mm256_and_si256(lo1, mask), top(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), mask), top(3))};
        for (int m = 0; m < MB; ++m) {
          const int8_t* x = xq + m * k_pad + k0 + j * 16;
          for (int p = 0; p < 2; ++p) {
            const __m256i s = _mm256_add_epi16(
                _mm256_maddubs_epi16(st[2 * p], bcast4_256(x + 8 * p)),
                _mm256_maddubs_epi16(st[2 * p + 1], bcast4_256(x + 8 * p + 4)));
            acc[m][h] = _mm256_add_epi32(acc[m][h], _mm256_madd_epi16(s, ones));
          }
        }
      }
    }
  } else {
    for (int64_t c = 0; c < group / 4; ++c) {
      for (int h = 0; h < 2; ++h) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * 64 + h * 32));
        const __m256i mag = _mm256_sign_epi8(raw, raw);  // |w| (-128 stays 0x80: 128 unsigned)
        for (int m = 0; m < MB; ++m) {
          const __m256i x = _mm256_sign_epi8(bcast4_256(xq + m * k_pad + k0 + c * 4), raw);
          acc[m][h] = _mm256_add_epi32(
              acc[m][h], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, x), ones));
        }
      }
    }
  }
  for (int m = 0; m < MB; ++m) {
    out[m][0] = acc[m][0];
    out[m][1] = acc[m][1];
  }
}

// sums[MB, 16] of one tile for MB rows from row0, for a tile whose scales and zeros were
// widened to float32 once (``wide``, [G][2][16]; two-level forms: each group's factor
// times its super-scale, so the super-block's sum is not kept apart): tile_int's
// arithmetic (quant_linear.cpp) in 8-lane registers. In GCC's 16-float vectors, AVX2
// built each row's scale splat through the stack and widened the scales again for every
// row: a prefill chunk's rows ran at about 30 GMAC/s, here 50-100.
// ``dots(g, out)`` gives group g's exact int32 sums (less 6-bit codes' offset).
template <int MB, typename Dots>
inline void tile_sums(const float* wide, bool zeros, const hearth::quant::QuantRows& xr,
                      int64_t row0, int64_t groups, Dots&& dots, float* sums) {
  __m256 acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  __m256i d[MB][2];
  for (int64_t g = 0; g < groups; ++g) {
    dots(g, d);
    const float* sz = wide + g * 32;
    const __m256 s0 = _mm256_loadu_ps(sz), s1 = _mm256_loadu_ps(sz + 8);
    for (int m = 0; m < MB; ++m) {
      const int64_t at = (row0 + m) * groups + g;
      const __m256 xs = _mm256_set1_ps(xr.scale[at]);
      acc[m][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[m][0]), _mm256_mul_ps(s0, xs), acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[m][1]), _mm256_mul_ps(s1, xs), acc[m][1]);
      if (zeros) {
        const __m256 xsum = _mm256_set1_ps(xr.sum[at]);
        acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(sz + 16), xsum, acc[m][0]);
        acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(sz + 24), xsum, acc[m][1]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) {
    _mm256_storeu_ps(sums + m * 16, acc[m][0]);
    _mm256_storeu_ps(sums + m * 16 + 8, acc[m][1]);
  }
}
// A tile's scales and zeros (zeros 0 where there are none) widened to float32 into out,
// [G][2][16]; returns out.
inline const float* widen(const hearth::quant::Params& p, int64_t groups, float* out) {
  for (int64_t g = 0; g < groups; ++g) {
    const hearth::vec::f16v sv = p.scale(g), zv = p.zero(g);
    std::memcpy(out + g * 32, &sv, sizeof(sv));
    std::memcpy(out + g * 32 + 16, &zv, sizeof(zv));
  }
  return out;
}

// quant_linear.cpp's tile_int for a tile whose scales are widened (p.wide).
template <int Bits, int MB>
inline void tile_int_wide(const uint8_t* w, const hearth::quant::Params& p,
                          const hearth::quant::QuantRows& xr, int64_t row0,
                          const hearth::quant::Shape& sh, float* sums) {
  const int64_t bytes = sh.group * 16 * Bits / 8;
  const auto dots = [&](int64_t g, __m256i (&d)[MB][2]) {
    hearth::vec::prefetch_ahead(w + g * bytes, bytes);
    group_dots<Bits, MB>(w + g * bytes, xr.q.data() + row0 * sh.k_pad, sh.k_pad, g * sh.group,
                         sh.group, d);
    if constexpr (Bits == 6) {  // the codes' +32, per row and group
      for (int m = 0; m < MB; ++m) {
        const __m256i off = _mm256_set1_epi32(32 * xr.qsum[(row0 + m) * sh.groups + g]);
        d[m][0] = _mm256_sub_epi32(d[m][0], off);
        d[m][1] = _mm256_sub_epi32(d[m][1], off);
      }
    }
  };
  tile_sums<MB>(p.wide, p.has_zero(), xr, row0, sh.groups, dots, sums);
}
#endif

#if defined(__AVX2__)
constexpr int64_t kScaledFloats = 8;  // the floats one store_scaled call takes

// bfloat16 of v, rounded to nearest even as c10 does (the values are finite: the scales
// and zeros are checked): add 0x7FFF plus the kept part's lowest bit, keep the top.
inline __m128i to_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  const __m256i top = _mm256_srli_epi32(up, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
}

// The prefill's q * s + z for the 8 floats at b, into out (float32, or bfloat16): a
// multiply, then an add (no fused multiply-add: the reference rounds twice).
template <typename T>
inline void store_scaled(const float* b, float sv, float zv, T* out) {
  __m256 v = _mm256_mul_ps(_mm256_loadu_ps(b), _mm256_set1_ps(sv));
  asm("" : "+x"(v));
  v = _mm256_add_ps(v, _mm256_set1_ps(zv));
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(out, v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), to_bf16(v));
  }
}

// One lane's 4 signed 8-bit codes (at src) widened to float at out.
inline void codes8(const int8_t* src, float* out) {
  const __m128i word = _mm_cvtsi32_si128(hearth::quant::word_at(src));
  _mm_storeu_ps(out, _mm_cvtepi32_ps(_mm_cvtepi8_epi32(word)));
}

// One lane's 8 6-bit codes of pair p (steps 2p and 2p + 1): the nibbles of low (4 low,
// then 4 high) and their top bits from top, less the +32 offset, as floats at out.
inline void codes6(int32_t low, int32_t top, int p, float* out) {
  const __m256i nib_shifts = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28);
  const __m256i top_shifts[2] = {_mm256_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26),
                                 _mm256_setr_epi32(4, 12, 20, 28, 6, 14, 22, 30)};
  const __m256i nibble = _mm256_set1_epi32(0x0F), two = _mm256_set1_epi32(0x03);
  const __m256i offset = _mm256_set1_epi32(32);
  const __m256i q = _mm256_or_si256(
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(low), nib_shifts), nibble),
      _mm256_slli_epi32(
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(top), top_shifts[p]), two), 4));
  _mm256_storeu_ps(out, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, offset)));
}

// One lane's 8 4-bit codes (the nibbles of word: 4 low, then 4 high) as floats at out.
inline void codes4(int32_t word, float* out) {
  const __m256i shifts = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28);
  const __m256i nibble = _mm256_set1_epi32(0x0F);
  const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), nibble);
  _mm256_storeu_ps(out, _mm256_cvtepi32_ps(q));
}
#endif

}  // namespace hearth::quant_avx2
