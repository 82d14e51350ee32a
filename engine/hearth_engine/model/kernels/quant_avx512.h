// quant_linear.cpp's AVX-512 paths: the decode rows' int8 quantization (AVX-512 F, BW
// and VL), the group dot products by AVX-512 VNNI's vpdpbusd (``HEARTH_QVNNI``), and the
// prefill's scaled stores of dequantized weights (AVX-512 F, bfloat16 by AVX512-BF16).
// The same arithmetic as the generic code (quant_generic.h, quant_dequant.h), bit for bit.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant_common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(HEARTH_QUANT_GENERIC)
#define HEARTH_QVNNI 1
#endif

namespace hearth::quant_avx512 {

using hearth::quant::i16v;
using hearth::quant::QuantRows;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// n (<= 16) inputs from p as float32 lanes, the rest 0.
inline __m512 load_inputs(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
inline __m512 load_inputs(const at::BFloat16* p, int64_t n) {
  const __m256i raw = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// One group of one row (k1 - k0 inputs): its amax and sum, then its int8 codes, 16 lanes
// at a time. The same arithmetic as the scalar loop (quant_generic.h: x * (127 / amax),
// rounded half to even, clamped), in vector instructions: this runs on the calling thread
// before the parallel part, and scalar code took 30 us of a 300 us 1536 x 8960 call.
template <typename T>
inline void quantize_group(const T* x, int64_t n, float* scale, float* sum, int8_t* q,
                           int32_t* qsum) {
  __m512 amax = _mm512_setzero_ps(), total = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __m512 v = load_inputs(x + c, std::min<int64_t>(16, n - c));
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    total = _mm512_add_ps(total, v);
  }
  *sum = _mm512_reduce_add_ps(total);
  const float top = _mm512_reduce_max_ps(amax);
  *scale = 0.0f;
  *qsum = 0;
  if (top == 0.0f) return;
  *scale = top / 127.0f;
  const __m512 inv = _mm512_set1_ps(127.0f / top);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  __m512i qs = _mm512_setzero_si512();
  for (int64_t c = 0; c < n; c += 16) {
    const int64_t left = std::min<int64_t>(16, n - c);
    const __m512 v = _mm512_mul_ps(load_inputs(x + c, left), inv);
    const __m512 r = _mm512_min_ps(
        hi, _mm512_max_ps(lo, _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    const __m512i iv = _mm512_cvtps_epi32(r);
    qs = _mm512_add_epi32(qs, iv);
    _mm_mask_storeu_epi8(q + c, static_cast<__mmask16>((1u << left) - 1), _mm512_cvtepi32_epi8(iv));
  }
  *qsum = _mm512_reduce_add_epi32(qs);
}
#endif

#if defined(HEARTH_QVNNI)
inline __m512i bcast4(const void* p) { return _mm512_set1_epi32(hearth::quant::word_at(p)); }

template <int Bits, int MB>
inline void group_dots(const uint8_t* w, const QuantRows& xr, int64_t row0, int64_t k_pad,
                       int64_t k0, int64_t group, i16v* dots) {
  __m512i a[MB], b[MB];
  for (int m = 0; m < MB; ++m) a[m] = b[m] = _mm512_setzero_si512();
  if constexpr (Bits == 4) {
    // The high nibbles stay in place (16 x the code, one AND and no shift): b sums 16 x
    // their products, exactly (4 x 240 x 127 per instruction, far inside int32), and
    // comes back down by an exact arithmetic shift.
    const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(static_cast<char>(0xF0));
    const int8_t* xq = xr.q.data() + row0 * k_pad + k0;
    for (int64_t p = 0; p < group / 8; ++p) {
      const __m512i raw = _mm512_loadu_si512(w + p * 64);
      const __m512i lo = _mm512_and_si512(raw, low);
      const __m512i hi = _mm512_and_si512(raw, high);
      for (int m = 0; m < MB; ++m) {
        a[m] = _mm512_dpbusd_epi32(a[m], lo, bcast4(xq + m * k_pad + p * 8));
        b[m] = _mm512_dpbusd_epi32(b[m], hi, bcast4(xq + m * k_pad + p * 8 + 4));
      }
    }
    for (int m = 0; m < MB; ++m) {
      const __m512i s = _mm512_add_epi32(a[m], _mm512_srai_epi32(b[m], 4));
      std::memcpy(&dots[m], &s, sizeof(s));
    }
  } else if constexpr (Bits == 6) {
    // Step s's top bits are moved to bits 4-5 (a 16-bit shift by 4 - 2s), and one
    // vpternlogd keeps them there beside the low nibble: lo | (top & 0x30).
    const __m512i mask = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    const int8_t* xq = xr.q.data() + row0 * k_pad + k0;
    for (int64_t j = 0; j < group / 16; ++j) {
      const uint8_t* blk = w + j * 192;
      const __m512i lo0 = _mm512_loadu_si512(blk), lo1 = _mm512_loadu_si512(blk + 64);
      const __m512i hb = _mm512_loadu_si512(blk + 128);
      const auto join = [&](__m512i low, __m512i top) {  // low | (top & 0x30)
        return _mm512_ternarylogic_epi32(low, top, bits45, 0xF8);
      };
      const __m512i s0 = join(_mm512_and_si512(lo0, mask), _mm512_slli_epi16(hb, 4));
      const __m512i s1 =
          join(_mm512_and_si512(_mm512_srli_epi16(lo0, 4), mask), _mm512_slli_epi16(hb, 2));
      const __m512i s2 = join(_mm512_and_si512(lo1, mask), hb);
      const __m512i s3 =
          join(_mm512_and_si512(_mm512_srli_epi16(lo1, 4), mask), _mm512_srli_epi16(hb, 2));
      for (int m = 0; m < MB; ++m) {
        const int8_t* x = xq + m * k_pad + j * 16;
        a[m] = _mm512_dpbusd_epi32(a[m], s0, bcast4(x));
        b[m] = _mm512_dpbusd_epi32(b[m], s1, bcast4(x + 4));
        a[m] = _mm512_dpbusd_epi32(a[m], s2, bcast4(x + 8));
        b[m] = _mm512_dpbusd_epi32(b[m], s3, bcast4(x + 12));
      }
    }
    for (int m = 0; m < MB; ++m) {
      const __m512i s = _mm512_add_epi32(a[m], b[m]);
      std::memcpy(&dots[m], &s, sizeof(s));
    }
  } else {
    // vpdpbusd multiplies unsigned by signed bytes: the inputs go in as q + 128 and
    // 128 * (the weights' sum) comes off again.
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i wsum = _mm512_setzero_si512();
    const uint8_t* xu = xr.u.data() + row0 * k_pad + k0;
    for (int64_t c = 0; c < group / 4; ++c) {
      const __m512i raw = _mm512_loadu_si512(w + c * 64);
      wsum = _mm512_dpbusd_epi32(wsum, ones, raw);
      for (int m = 0; m < MB; ++m) a[m] = _mm512_dpbusd_epi32(a[m], bcast4(xu + m * k_pad + c * 4), raw);
    }
    const __m512i bias = _mm512_slli_epi32(wsum, 7);
    for (int m = 0; m < MB; ++m) {
      const __m512i s = _mm512_sub_epi32(a[m], bias);
      std::memcpy(&dots[m], &s, sizeof(s));
    }
  }
}
#endif

#if defined(HEARTH_QVNNI)
// The integer path's whole tile for 4-bit codes in one level of groups (Q4_0, Q4_1, and
// Hearth's own int4), MB rows: group_dots and the caller's float steps fused, so that
// every value stays in a register. One accumulator per row takes both nibbles (the high
// ones shifted down once per weight vector, for all MB rows, not once per row), and the
// float steps are tile_int's, in its order: acc += dots * (scale * x's scale) as one
// fused multiply-add, then acc += zero * x's sum. The int32 dots are exact either way,
// so the sums are tile_int's bit for bit. tile_int<4, 8> kept 16 accumulators and
// spilled them: on a 2-vCPU EPYC (Zen 4) the default model's four linears of a layer took
// 0.49 ms at 16 rows and 1.86 at 85; with this, 0.30 and 1.74 (its 576 -> 3072 one at 85
// rows: 362 -> 405 GOP/s, of vpdpbusd's 936 on two cores).
template <int MB>
inline void tile_int4(const uint8_t* w, const hearth::quant::Params& p, const QuantRows& xr,
                      int64_t row0, const hearth::quant::Shape& sh, float* sums) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t group_bytes = sh.group * hearth::quant::kLanes / 2;
  const bool zeros = p.has_zero();
  const int8_t* xq = xr.q.data() + row0 * sh.k_pad;
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < sh.groups; ++g) {
    const uint8_t* wg = w + g * group_bytes;
    hearth::vec::prefetch_ahead(wg, group_bytes);
    const int8_t* xg = xq + g * sh.group;
    __m512i a[MB];
    for (int m = 0; m < MB; ++m) a[m] = _mm512_setzero_si512();
    for (int64_t s = 0; s < sh.group / 8; ++s) {
      const __m512i raw = _mm512_loadu_si512(wg + s * 64);
      const __m512i lo = _mm512_and_si512(raw, low);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
      for (int m = 0; m < MB; ++m) {
        a[m] = _mm512_dpbusd_epi32(a[m], lo, bcast4(xg + m * sh.k_pad + s * 8));
        a[m] = _mm512_dpbusd_epi32(a[m], hi, bcast4(xg + m * sh.k_pad + s * 8 + 4));
      }
    }
    __m512 sv, zv;
    const hearth::vec::f16v sf = p.scale(g), zf = p.zero(g);
    std::memcpy(&sv, &sf, sizeof(sv));
    std::memcpy(&zv, &zf, sizeof(zv));
    for (int m = 0; m < MB; ++m) {
      const int64_t at = (row0 + m) * sh.groups + g;
      const __m512 xs = _mm512_mul_ps(sv, _mm512_set1_ps(xr.scale[at]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[m]), xs, acc[m]);
      if (zeros) acc[m] = _mm512_fmadd_ps(zv, _mm512_set1_ps(xr.sum[at]), acc[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(sums + m * hearth::quant::kLanes, acc[m]);
}
#endif

#if defined(__AVX512F__)
constexpr int64_t kScaledFloats = 16;  // the floats one store_scaled call takes

// The prefill's q * s + z for the 16 floats at b, into out: float32, or bfloat16 rounded
// to nearest even. Two instructions on purpose: a fused multiply-add would round once,
// not as the reference (``tiles.dequantize``) does.
template <typename T>
inline void store_scaled(const float* b, float sv, float zv, T* out) {
  __m512 v = _mm512_mul_ps(_mm512_loadu_ps(b), _mm512_set1_ps(sv));
  asm("" : "+v"(v));  // keeps the compiler from fusing the add into the multiply
  v = _mm512_add_ps(v, _mm512_set1_ps(zv));
  if constexpr (std::is_same_v<T, float>) {
    _mm512_storeu_ps(out, v);
  } else {
#if defined(__AVX512BF16__)
    const __m256bh h = _mm512_cvtneps_pbh(v);  // round to nearest even, as c10
    std::memcpy(out, &h, sizeof(h));
#else
    alignas(64) float tmp[16];
    _mm512_store_ps(tmp, v);
    for (int i = 0; i < 16; ++i) out[i] = static_cast<T>(tmp[i]);
#endif
  }
}
#endif

}  // namespace hearth::quant_avx512
