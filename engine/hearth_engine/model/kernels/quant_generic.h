// quant_linear.cpp's generic paths, for CPUs that none of its instruction-set paths
// (quant_avx512.h, quant_avx2.h, quant_neon.h) takes, and under HEARTH_QUANT_GENERIC: the
// rows' int8 quantization in scalar code and the group dot products in GCC vector
// extensions. The other paths compute these very integers and floats.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "quant_common.h"

namespace hearth::quant_generic {

using hearth::quant::i16v;
using hearth::quant::lane_input;
using hearth::quant::load_u;
using hearth::quant::six_step;
using hearth::quant::u16v;


// One group of one row (k1 - k0 inputs): its amax and sum, then its int8 codes (x *
// (127 / amax), rounded half to even, clamped).
template <typename T>
inline void quantize_group(const T* x, int64_t n, float* scale, float* sum, int8_t* q,
                           int32_t* qsum) {
  float amax = 0.0f, total = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    const float v = static_cast<float>(x[c]);
    amax = std::max(amax, std::fabs(v));
    total += v;
  }
  *sum = total;
  *scale = 0.0f;
  *qsum = 0;
  if (amax == 0.0f) return;
  *scale = amax / 127.0f;
  const float inv = 127.0f / amax;
  for (int64_t c = 0; c < n; ++c) {
    const float v = std::nearbyint(static_cast<float>(x[c]) * inv);
    q[c] = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, v)));
    *qsum += q[c];
  }
}

// One group's exact int32 dot products (16 features) for MB rows: generic vector code.
template <int Bits, int MB>
inline void group_dots(const uint8_t* w, const int8_t* xq, int64_t k_pad, int64_t k0,
                       int64_t group, i16v* dots) {
  for (int m = 0; m < MB; ++m) dots[m] = i16v{};
  if constexpr (Bits == 4) {
    for (int64_t p = 0; p < group / 8; ++p) {
      const u16v raw = load_u(w + p * 64);
      const u16v lo = raw & 0x0F0F0F0Fu, hi = (raw >> 4) & 0x0F0F0F0Fu;
      const int64_t k = k0 + p * 8;
      for (int i = 0; i < 4; ++i) {
        const i16v wl = lane_input<4>(lo, i), wh = lane_input<4>(hi, i);
        for (int m = 0; m < MB; ++m)
          dots[m] += wl * (int32_t)xq[m * k_pad + k + i] + wh * (int32_t)xq[m * k_pad + k + 4 + i];
      }
    }
  } else if constexpr (Bits == 6) {
    for (int64_t j = 0; j < group / 16; ++j) {
      for (int s = 0; s < 4; ++s) {
        const u16v raw = six_step(w + j * 192, s);
        const int64_t k = k0 + j * 16 + s * 4;
        for (int i = 0; i < 4; ++i) {
          const i16v wi = lane_input<4>(raw, i);
          for (int m = 0; m < MB; ++m) dots[m] += wi * (int32_t)xq[m * k_pad + k + i];
        }
      }
    }
  } else {
    for (int64_t c = 0; c < group / 4; ++c) {
      const u16v raw = load_u(w + c * 64);
      const int64_t k = k0 + c * 4;
      for (int i = 0; i < 4; ++i) {
        const i16v wi = lane_input<8>(raw, i);
        for (int m = 0; m < MB; ++m) dots[m] += wi * (int32_t)xq[m * k_pad + k + i];
      }
    }
  }
}

}  // namespace hearth::quant_generic
