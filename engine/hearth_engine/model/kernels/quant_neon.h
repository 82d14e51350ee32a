// quant_linear.cpp's group dot products on Arm CPUs with the dot-product instructions
// (Armv8.2's SDOT: Cortex-A55 as in HA Green, A76 as in a Raspberry Pi 5; not a Pi 4's
// A72, which takes the generic code). SDOT adds four int8 products into each int32 lane,
// the same operand order as the tiles' steps ([16 features][4 inputs], see
// quant_linear.cpp's header): four 16-byte loads and four instructions give 16 features
// x 4 inputs of one row. The sums are exact int32, so the results are those of the
// generic code, bit for bit.
#pragma once

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD) && !defined(HEARTH_QUANT_GENERIC)
#define HEARTH_QDOT 1
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "vec.h"

namespace hearth::quant_neon {

using hearth::vec::i16v;

// The 4 int8 inputs at p in every 32-bit lane.
inline int8x16_t bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

// One group's exact int32 dot products (16 features) for MB rows: 4-bit codes (0..15),
// 6-bit stored codes (0..63; the caller takes off the +32 offset) or 8-bit signed codes.
template <int Bits, int MB>
inline void group_dots(const uint8_t* w, const int8_t* xq, int64_t k_pad, int64_t k0,
                       int64_t group, i16v* dots) {
  int32x4_t acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = vdupq_n_s32(0);
  // One step: weights ws (features 4j..4j+3 in ws[j]) times inputs k..k+3 of each row.
  const auto step = [&](const int8x16_t* ws, int64_t k) {
    for (int m = 0; m < MB; ++m) {
      const int8x16_t x = bcast4(xq + m * k_pad + k);
      for (int j = 0; j < 4; ++j) acc[m][j] = vdotq_s32(acc[m][j], ws[j], x);
    }
  };
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  if constexpr (Bits == 4) {  // 64 bytes: the even step in the low nibbles, the odd in the high
    for (int64_t p = 0; p < group / 8; ++p) {
      int8x16_t lo[4], hi[4];
      for (int j = 0; j < 4; ++j) {
        const uint8x16_t raw = vld1q_u8(w + p * 64 + j * 16);
        lo[j] = vreinterpretq_s8_u8(vandq_u8(raw, nibble));
        hi[j] = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
      }
      step(lo, k0 + p * 8);
      step(hi, k0 + p * 8 + 4);
    }
  } else if constexpr (Bits == 6) {  // 192-byte blocks of 16 inputs: nibbles, then top bits
    const uint8x16_t two = vdupq_n_u8(0x03);
    for (int64_t b = 0; b < group / 16; ++b) {
      const uint8_t* block = w + b * 192;
      for (int s = 0; s < 4; ++s) {
        const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * s));  // right by 2s
        int8x16_t codes[4];
        for (int j = 0; j < 4; ++j) {
          const uint8x16_t lo = vld1q_u8(block + (s / 2) * 64 + j * 16);
          const uint8x16_t top = vld1q_u8(block + 128 + j * 16);
          const uint8x16_t low = s % 2 ? vshrq_n_u8(lo, 4) : vandq_u8(lo, nibble);
          const uint8x16_t high = vshlq_n_u8(vandq_u8(vshlq_u8(top, shift), two), 4);
          codes[j] = vreinterpretq_s8_u8(vorrq_u8(low, high));
        }
        step(codes, k0 + b * 16 + s * 4);
      }
    }
  } else {
    for (int64_t c = 0; c < group / 4; ++c) {
      int8x16_t ws[4];
      for (int j = 0; j < 4; ++j) ws[j] = vld1q_s8(reinterpret_cast<const int8_t*>(w + c * 64 + j * 16));
      step(ws, k0 + c * 4);
    }
  }
  for (int m = 0; m < MB; ++m) std::memcpy(&dots[m], acc[m], sizeof(i16v));
}

}  // namespace hearth::quant_neon
#endif
