// quant_linear.cpp's prefill path: whole tiles dequantized into a scratch matrix for one
// GEMM (quant_dequant_tiles), and single features (quant_rows: an embedding lookup). q * s
// and then + z, the reference's two float32 roundings (``tiles.dequantize``), rounded once
// into bfloat16 or float32; the codes are unpacked and the products stored by AVX2 or
// AVX-512 where the CPU has them (quant_avx2.h, quant_avx512.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "quant_avx2.h"
#include "quant_avx512.h"
#include "quant_common.h"

namespace hearth::quant {

// Feature f's weights (dequantized, K of them) from its tile, into dst.
template <typename T>
void dequant_feature(const uint8_t* w, const Params& p, int64_t lane, const Shape& sh, T* dst) {
  for (int64_t g = 0; g < sh.groups; ++g) {
    const float sv = p.scale_at(g, lane), zv = p.zero_at(g, lane);
    const int64_t k1 = std::min(sh.k, (g + 1) * sh.group);
    for (int64_t k = g * sh.group; k < k1; ++k) {
      int q;
      if (sh.bits == 4) {
        const int64_t pair = k / 8, within = k % 8;
        const uint8_t byte = w[pair * 64 + lane * 4 + within % 4];
        q = within < 4 ? (byte & 0x0F) : (byte >> 4);
      } else if (sh.bits == 6) {
        const uint8_t* blk = w + (k / 16) * 192;
        const int step = (k % 16) / 4, i = k % 4;
        const uint8_t low = blk[(step / 2) * 64 + lane * 4 + i] >> (4 * (step % 2));
        const uint8_t top = blk[128 + lane * 4 + i] >> (2 * step);
        q = ((low & 0x0F) | ((top & 0x03) << 4)) - 32;
      } else {
        q = static_cast<int8_t>(w[(k / 4) * 64 + lane * 4 + k % 4]);
      }
      dst[k] = static_cast<T>(sv * static_cast<float>(q) + zv);
    }
  }
}

// A tile's 16 features as rows of the padded matrix ``dst`` ([16, K_pad], row stride
// ``stride``): per group, the codes are unpacked into a [16][group] float block (one read
// of the tile, in its own order), then each row is scaled (q * s, then + z: the
// reference's two float32 roundings) and rounded once into T. The prefill path.
constexpr int64_t kMaxGroup = 256;

#if defined(__AVX512F__)
namespace scaled = hearth::quant_avx512;
#elif defined(__AVX2__)
namespace scaled = hearth::quant_avx2;
#endif

template <typename T>
inline void store_scaled(const float* b, float sv, float zv, int64_t n, T* out) {
  int64_t c = 0;
#if defined(__AVX512F__) || defined(__AVX2__)  // whole vectors, then the rest one by one
  for (; c + scaled::kScaledFloats <= n; c += scaled::kScaledFloats)
    scaled::store_scaled(b + c, sv, zv, out + c);
#endif
  for (; c < n; ++c) {
    volatile float p = b[c] * sv;  // no fused multiply-add: the reference rounds twice
    out[c] = static_cast<T>(p + zv);
  }
}

template <int Bits, typename T>
void dequant_tile(const uint8_t* w, const Params& p, const Shape& sh,
                  int64_t stride, T* dst) {
  alignas(64) float block[kLanes * kMaxGroup];
  const int64_t group = sh.group;
  for (int64_t g = 0; g < sh.groups; ++g) {
    const int64_t k0 = g * group;
    if constexpr (Bits == 8) {
      const int8_t* src = reinterpret_cast<const int8_t*>(w) + (k0 / 4) * 64;
      for (int64_t j = 0; j < group / 4; ++j, src += 64)
        for (int lane = 0; lane < kLanes; ++lane) {
#if defined(__AVX2__)  // a lane's 4 codes widened at once (the loop below is scalar code)
          hearth::quant_avx2::codes8(src + lane * 4, block + lane * group + j * 4);
#else
          for (int i = 0; i < 4; ++i) block[lane * group + j * 4 + i] = src[lane * 4 + i];
#endif
        }
    } else if constexpr (Bits == 6) {
      const uint8_t* src = w + (k0 / 16) * 192;
      for (int64_t j = 0; j < group / 16; ++j, src += 192)
        for (int lane = 0; lane < kLanes; ++lane) {
          int32_t top;
          std::memcpy(&top, src + 128 + lane * 4, sizeof(top));
          for (int p = 0; p < 2; ++p) {  // pair p: steps 2p (low nibbles) and 2p + 1
            int32_t low;
            std::memcpy(&low, src + p * 64 + lane * 4, sizeof(low));
            float* out = block + lane * group + j * 16 + p * 8;
#if defined(__AVX2__)  // a lane's 8 codes: nibbles (4 low, then 4 high), and their top bits
            hearth::quant_avx2::codes6(low, top, p, out);
#else
            for (int e = 0; e < 8; ++e) {
              const int step = 2 * p + e / 4, i = e % 4;
              const uint32_t nib = (static_cast<uint32_t>(low) >> (8 * i + 4 * (e / 4))) & 0x0F;
              const uint32_t hi = (static_cast<uint32_t>(top) >> (8 * i + 2 * step)) & 0x03;
              out[e] = static_cast<float>(static_cast<int>(nib | (hi << 4)) - 32);
            }
#endif
          }
        }
    } else {
      const uint8_t* src = w + (k0 / 8) * 64;
      for (int64_t p = 0; p < group / 8; ++p, src += 64)
        for (int lane = 0; lane < kLanes; ++lane) {
#if defined(__AVX2__)  // a lane's 8 nibbles (4 low, then 4 high) in one register
          int32_t word;
          std::memcpy(&word, src + lane * 4, sizeof(word));
          hearth::quant_avx2::codes4(word, block + lane * group + p * 8);
#else
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = src[lane * 4 + i];
            block[lane * group + p * 8 + i] = static_cast<float>(byte & 0x0F);
            block[lane * group + p * 8 + 4 + i] = static_cast<float>(byte >> 4);
          }
#endif
        }
    }
    for (int lane = 0; lane < kLanes; ++lane) {
      const float sv = p.scale_at(g, lane), zv = p.zero_at(g, lane);
      store_scaled(block + lane * group, sv, zv, group, dst + lane * stride + k0);
    }
  }
}

}  // namespace hearth::quant
