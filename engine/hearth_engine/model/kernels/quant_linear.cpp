// Linears from group-quantized weights (4-bit unsigned or 8-bit signed) that stay packed:
// y = x W^T (+ b) with W[f, k] = s[f, g] * q[f, k] + z[f, g] (g = k / group; z optional).
//
// Python side: hearth_engine/quant/ (tiles.py packs, linear.py calls).
//
// Layout (one copy of the weights, read by every phase): tiles of 16 output features,
// K padded with zero weights to a multiple of the group (a partial last group is padded,
// never dropped). Inside a tile, a "step" is 4 consecutive inputs of the 16 features,
// 64 bytes as [16 features][4 inputs] when 8-bit; a 4-bit tile packs two steps into 64
// bytes (the even step in the low nibbles). 6-bit codes (-32..31, stored as q + 32) come
// in blocks of 16 inputs, 192 bytes: their low nibbles as a 4-bit tile holds them (128
// bytes), then their top two bits (64 bytes, byte [feature][input], step s of the four in
// bits 2s..2s+1). The scales and zeros are float16, [T, G, 16], or (``supers``, GGUF's
// K-quant super-blocks) int8 factors [T, G, 16] of float16 super-scales [T, GS, Z, 16]
// shared by ``per_super`` groups (Z = 1, or 2 with zeros): s = super * factor, exact in
// float32.
// That is the operand order of AVX-512 VNNI's vpdpbusd: one 64-byte load and one
// instruction give 16 features x 4 inputs of one row, with no horizontal sums.
//
// Decode (<= 16 rows, QuantPlan):
// * the integer path (bfloat16 and float32 inputs): each row is quantized per group to
//   int8 (scale = max|x| / 127, round half to even), the group's dot products are exact
//   int32 sums (vpdpbusd with AVX-512 VNNI, vpmaddubsw + vpmaddwd with AVX2, SDOT on Arm
//   CPUs with the dot-product extension, or the same integers from generic vector code; 6-bit: of the stored codes, less 32 x the group's
//   input sum), then y += s * (x_scale * dot) + z * sum(x) in
//   float32. That is what llama.cpp does with its q8 activations; the error it adds is
//   measured in the tests (``emulate``). On a 2-core AVX2 EPYC it read a 1536 x 8960
//   int4 matrix at 17 GB/s for one row, against 3 GB/s for the float path.
// * the exact path (float32 inputs, ``exact``): the weights are widened to float and the
//   sums are float32 (no activation rounding), for tests.
// Prefill (many rows) dequantizes whole tiles (quant_dequant_tiles) into a scratch matrix
// for one GEMM.

// Only what the kernels use (not <torch/extension.h>, which only the bindings in
// module.cpp need): parsing all of torch's headers once per file took most of the build.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(HEARTH_QUANT_GENERIC)
#define HEARTH_QVNNI 1
#elif defined(__AVX2__) && !defined(HEARTH_QUANT_GENERIC)
#define HEARTH_QAVX2 1
#endif
#include "quant_neon.h"  // HEARTH_QDOT: Arm's SDOT (aarch64 with the dot-product extension)

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant_linear.h"
#include "vec.h"

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kMaxRows = 16;
constexpr int64_t kBlockRows = 8;              // rows that share one read of a tile
constexpr int64_t kSerialBytes = 96 * 1024;    // smaller matrices: the calling thread only
constexpr int64_t kTaskBytes = 48 * 1024;      // weight bytes per parallel task, at least

typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef float f16v __attribute__((vector_size(64)));

struct Shape {
  int64_t n, k, k_pad, group, groups, bits, tile_bytes;
};

Shape shape_of(int64_t n, int64_t k, int64_t group, int64_t bits) {
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
// at a time. The same arithmetic as the scalar loop below (x * (127 / amax), rounded
// half to even, clamped), in vector instructions: this runs on the calling thread before
// the parallel part, and scalar code took 30 us of a 300 us 1536 x 8960 call.
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
#else
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
#endif

template <typename T>
QuantRows quantize_rows(const T* x, int64_t rows, const Shape& sh) {
  QuantRows r;
  r.q.assign(rows * sh.k_pad, 0);
  r.scale.resize(rows * sh.groups);
  r.sum.resize(rows * sh.groups);
  r.qsum.resize(rows * sh.groups);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t g = 0; g < sh.groups; ++g) {
      const int64_t k0 = g * sh.group, k1 = std::min(sh.k, k0 + sh.group);
      const int64_t at = m * sh.groups + g;
      quantize_group(x + m * sh.k + k0, k1 - k0, &r.scale[at], &r.sum[at],
                     &r.q[m * sh.k_pad + k0], &r.qsum[at]);
    }
  }
  if (sh.bits == 8) r.add_unsigned();
  return r;
}

// One group's exact int32 dot products (16 features) for MB rows: generic vector code.
template <int Bits, int MB>
inline void group_dots_generic(const uint8_t* w, const int8_t* xq, int64_t k_pad, int64_t k0,
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

#if defined(HEARTH_QVNNI)
inline __m512i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

template <int Bits, int MB>
inline void group_dots_vnni(const uint8_t* w, const QuantRows& xr, int64_t row0, int64_t k_pad,
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

#if defined(HEARTH_QAVX2)
// AVX2 has no vpdpbusd: vpmaddubsw multiplies unsigned by signed bytes into 16-bit sums
// of pairs, and vpmaddwd by ones adds those pairs into the same 32-bit lane sums (16
// features x 4 inputs, each 64-byte step as two 32-byte halves: features 0-7 and 8-15).
// 4-bit codes (0..15) times inputs (|x| <= 127) stay far inside int16: four steps add
// up in 16 bits (4 x 2 x 2 x 15 x 127 = 30,480) before one widening. 8-bit codes are
// signed: |w| goes in as the unsigned operand and x takes w's sign (vpsignb), so a pair
// is at most 2 x 128 x 127 = 32,512 (llama.cpp's q8 trick), widened every step.
inline __m256i bcast4_256(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

template <int Bits, int MB>
inline void group_dots_avx2(const uint8_t* w, const int8_t* xq, int64_t k_pad, int64_t k0,
                            int64_t group, i16v* dots) {
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
    std::memcpy(&dots[m], &acc[m][0], 32);
    std::memcpy(reinterpret_cast<char*>(&dots[m]) + 32, &acc[m][1], 32);
  }
}
#endif

// Group g's exact int32 dot products for MB rows starting at row0 (6-bit: less the codes'
// +32 offset), by the host's kernel.
template <int Bits, int MB>
inline void group_dots(const uint8_t* wg, const QuantRows& xr, int64_t row0, const Shape& sh,
                       int64_t g, i16v* dots) {
#if defined(HEARTH_QVNNI)
  group_dots_vnni<Bits, MB>(wg, xr, row0, sh.k_pad, g * sh.group, sh.group, dots);
#elif defined(HEARTH_QAVX2)
  group_dots_avx2<Bits, MB>(wg, xr.q.data() + row0 * sh.k_pad, sh.k_pad, g * sh.group, sh.group,
                            dots);
#elif defined(HEARTH_QDOT)
  hearth::quant_neon::group_dots<Bits, MB>(wg, xr.q.data() + row0 * sh.k_pad, sh.k_pad,
                                           g * sh.group, sh.group, dots);
#else
  group_dots_generic<Bits, MB>(wg, xr.q.data() + row0 * sh.k_pad, sh.k_pad, g * sh.group,
                               sh.group, dots);
#endif
  if constexpr (Bits == 6) {
    for (int m = 0; m < MB; ++m) dots[m] -= 32 * xr.qsum[(row0 + m) * sh.groups + g];  // q + 32
  }
}

// Integer path: the sums of one tile for MB rows starting at row0 (sums: [MB, 16]).
template <int Bits, int MB>
void tile_int(const uint8_t* w, const Params& p, const QuantRows& xr, int64_t row0,
              const Shape& sh, float* sums) {
  f16v acc[MB] = {};
  i16v dots[MB];
  const int64_t group_bytes = sh.group * kLanes * Bits / 8;
  const bool zeros = p.has_zero();
  if (p.per == 0) {
    for (int64_t g = 0; g < sh.groups; ++g) {
      hearth::vec::prefetch_ahead(w + g * group_bytes, group_bytes);
      group_dots<Bits, MB>(w + g * group_bytes, xr, row0, sh, g, dots);
      const f16v sv = p.scale(g), zv = p.zero(g);
      for (int m = 0; m < MB; ++m) {
        const int64_t at = (row0 + m) * sh.groups + g;
        acc[m] += __builtin_convertvector(dots[m], f16v) * (sv * xr.scale[at]);
        if (zeros) acc[m] += zv * xr.sum[at];
      }
    }
  } else {
    // Two levels: a super-block's groups add up with their int8 factors alone, and its
    // float16 super-scales multiply once at its end, not once per group.
    for (int64_t g0 = 0; g0 < sh.groups; g0 += p.per) {
      f16v part[MB] = {}, zpart[MB] = {};
      for (int64_t g = g0; g < std::min(sh.groups, g0 + p.per); ++g) {
        hearth::vec::prefetch_ahead(w + g * group_bytes, group_bytes);
        group_dots<Bits, MB>(w + g * group_bytes, xr, row0, sh, g, dots);
        const f16v sf = int8s_to_float(p.sf + g * kLanes);
        const f16v zf = zeros ? int8s_to_float(p.zf + g * kLanes) : f16v{};
        for (int m = 0; m < MB; ++m) {
          const int64_t at = (row0 + m) * sh.groups + g;
          part[m] += __builtin_convertvector(dots[m], f16v) * (sf * xr.scale[at]);
          if (zeros) zpart[m] += zf * xr.sum[at];
        }
      }
      const f16v ss = p.super_scale(g0 / p.per);
      const f16v zs = zeros ? p.super_zero(g0 / p.per) : f16v{};
      for (int m = 0; m < MB; ++m) acc[m] += part[m] * ss + zpart[m] * zs;
    }
  }
  for (int m = 0; m < MB; ++m) std::memcpy(sums + m * kLanes, &acc[m], sizeof(f16v));
}

// Float path (float32 inputs, padded to k_pad): weights widened to float, float32 sums.
template <int Bits, int MB>
void tile_float(const uint8_t* w, const Params& p, const float* xf, const float* xsum,
                const Shape& sh, float* sums) {
  f16v acc[MB] = {};
  const int64_t group_bytes = sh.group * kLanes * Bits / 8;
  for (int64_t g = 0; g < sh.groups; ++g) {
    const uint8_t* wg = w + g * group_bytes;
    const int64_t k0 = g * sh.group;
    f16v part[MB] = {};
    if constexpr (Bits == 4) {
      for (int64_t p = 0; p < sh.group / 8; ++p) {
        const u16v raw = load_u(wg + p * 64);
        const u16v lo = raw & 0x0F0F0F0Fu, hi = (raw >> 4) & 0x0F0F0F0Fu;
        for (int i = 0; i < 4; ++i) {
          const f16v wl = __builtin_convertvector(lane_input<4>(lo, i), f16v);
          const f16v wh = __builtin_convertvector(lane_input<4>(hi, i), f16v);
          for (int m = 0; m < MB; ++m) {
            const float* xm = xf + m * sh.k_pad + k0 + p * 8;
            part[m] += wl * xm[i] + wh * xm[4 + i];
          }
        }
      }
    } else if constexpr (Bits == 6) {
      for (int64_t j = 0; j < sh.group / 16; ++j) {
        for (int st = 0; st < 4; ++st) {
          const u16v raw = six_step(wg + j * 192, st);
          for (int i = 0; i < 4; ++i) {
            const f16v wi = __builtin_convertvector(lane_input<4>(raw, i) - 32, f16v);
            const int64_t at = k0 + j * 16 + st * 4 + i;
            for (int m = 0; m < MB; ++m) part[m] += wi * xf[m * sh.k_pad + at];
          }
        }
      }
    } else {
      for (int64_t c = 0; c < sh.group / 4; ++c) {
        const u16v raw = load_u(wg + c * 64);
        for (int i = 0; i < 4; ++i) {
          const f16v wi = __builtin_convertvector(lane_input<8>(raw, i), f16v);
          for (int m = 0; m < MB; ++m) part[m] += wi * xf[m * sh.k_pad + k0 + c * 4 + i];
        }
      }
    }
    const f16v sv = p.scale(g), zv = p.zero(g);
    for (int m = 0; m < MB; ++m) {
      acc[m] += part[m] * sv;
      if (p.has_zero()) acc[m] += zv * xsum[m * sh.groups + g];
    }
  }
  for (int m = 0; m < MB; ++m) std::memcpy(sums + m * kLanes, &acc[m], sizeof(f16v));
}

template <int Bits, int MB>
void run_block(bool integer, const uint8_t* w, const Params& p,
               const QuantRows& xr, const std::vector<float>& xf, const std::vector<float>& xsum,
               int64_t row0, const Shape& sh, float* sums) {
  if (integer) {
    tile_int<Bits, MB>(w, p, xr, row0, sh, sums);
  } else {
    tile_float<Bits, MB>(w, p, xf.data() + row0 * sh.k_pad, xsum.data() + row0 * sh.groups,
                         sh, sums);
  }
}

template <int Bits>
void dispatch_block(int mb, bool integer, const uint8_t* w, const Params& p,
                    const QuantRows& xr, const std::vector<float>& xf,
                    const std::vector<float>& xsum, int64_t row0, const Shape& sh, float* sums) {
  switch (mb) {
    case 8:
      return run_block<Bits, 8>(integer, w, p, xr, xf, xsum, row0, sh, sums);
    case 4:
      return run_block<Bits, 4>(integer, w, p, xr, xf, xsum, row0, sh, sums);
    case 2:
      return run_block<Bits, 2>(integer, w, p, xr, xf, xsum, row0, sh, sums);
    default:
      return run_block<Bits, 1>(integer, w, p, xr, xf, xsum, row0, sh, sums);
  }
}

// The rows as one group size's kernels read them: int8 per group (the integer path), or
// float32 padded to K_pad with each group's sum (the exact path).
struct Activations {
  QuantRows xr;
  std::vector<float> xf, xsum;
};

template <typename T>
Activations prepare_rows(const T* xs, int64_t rows, const Shape& sh, bool integer) {
  Activations a;
  if (integer) {
    a.xr = quantize_rows(xs, rows, sh);
    return a;
  }
  a.xf.assign(rows * sh.k_pad, 0.0f);
  a.xsum.assign(rows * sh.groups, 0.0f);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t c = 0; c < sh.k; ++c) {
      const float v = static_cast<float>(xs[m * sh.k + c]);
      a.xf[m * sh.k_pad + c] = v;
      a.xsum[m * sh.groups + c / sh.group] += v;
    }
  }
  return a;
}

// One matrix of a plan (hearth::QuantPlan): its tiles and parameters, held, and where its
// features start among the plan's outputs.
struct PlanPart {
  at::Tensor tiles, scales, zeros, supers;
  Shape sh;
  Params params;
  int64_t col0;
};

// Tiles [t0, t1) of one part, for every row: y[m, col0 + f] = sum (+ bias), in T.
template <typename T>
void part_tiles(const PlanPart& part, const Activations& a, bool integer, int64_t rows,
                int64_t t0, int64_t t1, const float* bias, int64_t ld, T* dst) {
  const Shape& sh = part.sh;
  const uint8_t* wbase = part.tiles.data_ptr<uint8_t>();
  float sums[kBlockRows * kLanes];
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* w = wbase + t * sh.tile_bytes;
    const Params p = part.params.tile(t, sh.groups);
    for (int64_t m0 = 0; m0 < rows;) {
      const int64_t left = rows - m0;
      const int mb = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      if (sh.bits == 4) {
        dispatch_block<4>(mb, integer, w, p, a.xr, a.xf, a.xsum, m0, sh, sums);
      } else if (sh.bits == 6) {
        dispatch_block<6>(mb, integer, w, p, a.xr, a.xf, a.xsum, m0, sh, sums);
      } else {
        dispatch_block<8>(mb, integer, w, p, a.xr, a.xf, a.xsum, m0, sh, sums);
      }
      const int64_t f1 = std::min(sh.n, (t + 1) * kLanes);
      for (int m = 0; m < mb; ++m) {
        T* row = dst + (m0 + m) * ld + part.col0;
        for (int64_t f = t * kLanes; f < f1; ++f) {
          float v = sums[m * kLanes + f - t * kLanes];
          if (bias != nullptr) v += bias[part.col0 + f];
          row[f] = static_cast<T>(v);
        }
      }
      m0 += mb;
    }
  }
}

// Every part of a plan for rows x: one parallel region over all their tiles (work items
// of about kTaskBytes, so that two threads split the bytes evenly), the rows prepared once
// per group size. dst is [rows, n_total].
template <typename T>
void plan_impl(const T* xs, int64_t rows, const std::vector<PlanPart>& parts, const float* bias,
               bool integer, int64_t n_total, T* dst) {
  std::vector<int64_t> seen;  // group sizes, in order met
  std::vector<Activations> acts;
  std::vector<size_t> which(parts.size());
  struct Task {
    size_t part;
    int64_t t0, t1;
  };
  std::vector<Task> tasks;
  int64_t bytes = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Shape& sh = parts[i].sh;
    const auto at = std::find(seen.begin(), seen.end(), sh.group);
    which[i] = static_cast<size_t>(at - seen.begin());
    if (at == seen.end()) {
      seen.push_back(sh.group);
      acts.push_back(prepare_rows(xs, rows, sh, integer));
    } else if (integer && sh.bits == 8 && acts[which[i]].xr.u.empty()) {
      acts[which[i]].xr.add_unsigned();  // rows shared with a 4- or 6-bit part
    }
    const int64_t count = (sh.n + kLanes - 1) / kLanes;
    const int64_t step = std::max<int64_t>(1, kTaskBytes / sh.tile_bytes);
    for (int64_t t0 = 0; t0 < count; t0 += step) tasks.push_back({i, t0, std::min(count, t0 + step)});
    bytes += count * sh.tile_bytes;
  }
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const Task& task = tasks[j];
      part_tiles(parts[task.part], acts[which[task.part]], integer, rows, task.t0, task.t1, bias,
                 n_total, dst);
    }
  };
  const int64_t count = static_cast<int64_t>(tasks.size());
  if (bytes < kSerialBytes) {
    run(0, count);
  } else {
    at::parallel_for(0, count, 1, run);
  }
}

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

// The checked scales and zeros of tiles of this shape, as tile 0's ``Params``.
Params checked_params(const at::Tensor& tiles, const at::Tensor& scales,
                      const c10::optional<at::Tensor>& zeros,
                      const c10::optional<at::Tensor>& supers, int64_t per_super,
                      const Shape& sh) {
  TORCH_CHECK(sh.bits == 4 || sh.bits == 6 || sh.bits == 8,
              "quantized tiles are 4-, 6- or 8-bit, not ", sh.bits);
  TORCH_CHECK(sh.group > 0 && sh.group % (sh.bits == 6 ? 16 : 8) == 0,
              "the group must be a multiple of 8 (6-bit: of 16)");
  TORCH_CHECK(sh.n > 0 && sh.k > 0, "the weight must have features and inputs");
  const int64_t count = (sh.n + kLanes - 1) / kLanes;
  TORCH_CHECK(tiles.device().is_cpu() && tiles.scalar_type() == at::kByte &&
                  tiles.is_contiguous() && tiles.numel() == count * sh.tile_bytes,
              "tiles must be contiguous uint8, ", count * sh.tile_bytes, " bytes for this shape");
  const bool two = supers.has_value();
  TORCH_CHECK(two == (per_super > 0), "super-scales need their groups per super-block");
  const auto kind = two ? at::kChar : at::kHalf;
  TORCH_CHECK(scales.device().is_cpu() && scales.scalar_type() == kind &&
                  scales.is_contiguous() && scales.numel() == count * sh.groups * kLanes,
              "scales must be contiguous ", two ? "int8" : "float16", " [T, G, 16]");
  if (zeros.has_value()) {
    TORCH_CHECK(zeros->device().is_cpu() && zeros->scalar_type() == kind &&
                    zeros->is_contiguous() && zeros->numel() == scales.numel(),
                "zeros must be like the scales");
  }
  Params p;
  if (!two) {
    p.s = scales.data_ptr<at::Half>();
    p.z = zeros.has_value() ? zeros->data_ptr<at::Half>() : nullptr;
    return p;
  }
  p.per = per_super;
  p.zn = zeros.has_value() ? 2 : 1;
  const int64_t supers_per_tile = (sh.groups + per_super - 1) / per_super;
  TORCH_CHECK(supers->device().is_cpu() && supers->scalar_type() == at::kHalf &&
                  supers->is_contiguous() &&
                  supers->numel() == count * supers_per_tile * p.zn * kLanes,
              "super-scales must be contiguous float16 [T, GS, Z, 16]");
  p.sf = scales.data_ptr<int8_t>();
  p.zf = zeros.has_value() ? zeros->data_ptr<int8_t>() : nullptr;
  p.sup = supers->data_ptr<at::Half>();
  return p;
}

// A tile's 16 features as rows of the padded matrix ``dst`` ([16, K_pad], row stride
// ``stride``): per group, the codes are unpacked into a [16][group] float block (one read
// of the tile, in its own order), then each row is scaled (q * s, then + z: the
// reference's two float32 roundings) and rounded once into T. The prefill path.
constexpr int64_t kMaxGroup = 256;

template <typename T>
inline void store_scaled(const float* b, float sv, float zv, int64_t n, T* out) {
  int64_t c = 0;
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(sv), vz = _mm512_set1_ps(zv);
  for (; c + 16 <= n; c += 16) {
    // Two instructions on purpose: a fused multiply-add would round once, not as the
    // reference (``tiles.dequantize``) does.
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(b + c), vs);
    asm("" : "+v"(v));  // keeps the compiler from fusing the add into the multiply
    v = _mm512_add_ps(v, vz);
    if constexpr (std::is_same_v<T, float>) {
      _mm512_storeu_ps(out + c, v);
    } else {
#if defined(__AVX512BF16__)
      const __m256bh h = _mm512_cvtneps_pbh(v);  // round to nearest even, as c10
      std::memcpy(out + c, &h, sizeof(h));
#else
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, v);
      for (int i = 0; i < 16; ++i) out[c + i] = static_cast<T>(tmp[i]);
#endif
    }
  }
#elif defined(__AVX2__)
  const __m256 vs = _mm256_set1_ps(sv), vz = _mm256_set1_ps(zv);
  for (; c + 8 <= n; c += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(b + c), vs);
    asm("" : "+x"(v));  // no fused multiply-add, as above
    v = _mm256_add_ps(v, vz);
    if constexpr (std::is_same_v<T, float>) {
      _mm256_storeu_ps(out + c, v);
    } else {
      // bfloat16, round to nearest even as c10 does (the values are finite: the scales
      // and zeros are checked): add 0x7FFF plus the kept part's lowest bit, keep the top.
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
      const __m256i top = _mm256_srli_epi32(up, 16);
      const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(top),
                                              _mm256_extracti128_si256(top, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), packed);
    }
  }
#endif
  for (; c < n; ++c) {
    volatile float p = b[c] * sv;  // no fused multiply-add here either
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
          int32_t word;
          std::memcpy(&word, src + lane * 4, sizeof(word));
          _mm_storeu_ps(block + lane * group + j * 4,
                        _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(word))));
#else
          for (int i = 0; i < 4; ++i) block[lane * group + j * 4 + i] = src[lane * 4 + i];
#endif
        }
    } else if constexpr (Bits == 6) {
      const uint8_t* src = w + (k0 / 16) * 192;
#if defined(__AVX2__)  // a lane's 8 codes: nibbles (4 low, then 4 high), and their top bits
      const __m256i nib_shifts = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28);
      const __m256i top_shifts[2] = {_mm256_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26),
                                     _mm256_setr_epi32(4, 12, 20, 28, 6, 14, 22, 30)};
      const __m256i nibble = _mm256_set1_epi32(0x0F), two = _mm256_set1_epi32(0x03);
      const __m256i offset = _mm256_set1_epi32(32);
#endif
      for (int64_t j = 0; j < group / 16; ++j, src += 192)
        for (int lane = 0; lane < kLanes; ++lane) {
          int32_t top;
          std::memcpy(&top, src + 128 + lane * 4, sizeof(top));
          for (int p = 0; p < 2; ++p) {  // pair p: steps 2p (low nibbles) and 2p + 1
            int32_t low;
            std::memcpy(&low, src + p * 64 + lane * 4, sizeof(low));
            float* out = block + lane * group + j * 16 + p * 8;
#if defined(__AVX2__)
            const __m256i q = _mm256_or_si256(
                _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(low), nib_shifts), nibble),
                _mm256_slli_epi32(
                    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(top), top_shifts[p]), two),
                    4));
            _mm256_storeu_ps(out, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, offset)));
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
#if defined(__AVX2__)  // a lane's 8 nibbles (4 low, then 4 high) in one register
      const __m256i shifts = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28);
      const __m256i nibble = _mm256_set1_epi32(0x0F);
#endif
      for (int64_t p = 0; p < group / 8; ++p, src += 64)
        for (int lane = 0; lane < kLanes; ++lane) {
#if defined(__AVX2__)
          int32_t word;
          std::memcpy(&word, src + lane * 4, sizeof(word));
          const __m256i q = _mm256_and_si256(
              _mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), nibble);
          _mm256_storeu_ps(block + lane * group + p * 8, _mm256_cvtepi32_ps(q));
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

// Calls run(T*) with out's data as bfloat16 or float32, the dtypes the dequantizers write.
template <typename Run>
void on_float_out(at::Tensor& out, const char* what, Run&& run) {
  switch (out.scalar_type()) {
    case at::kBFloat16:
      run(out.data_ptr<c10::BFloat16>());
      break;
    case at::kFloat:
      run(out.data_ptr<float>());
      break;
    default:
      TORCH_CHECK(false, what, " writes bfloat16 or float32, not ", out.scalar_type());
  }
}

}  // namespace

namespace hearth {

struct QuantPlan::Parts {
  std::vector<PlanPart> list;
};

QuantPlan::QuantPlan(int64_t in_features, const c10::optional<at::Tensor>& bias)
    : in_features_(in_features), parts_(std::make_shared<Parts>()) {
  TORCH_CHECK(in_features > 0, "a quantized linear needs inputs");
  if (bias.has_value()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->dim() == 1, "the bias must be [N] on the CPU");
    bias_ = bias->to(at::kFloat).contiguous();  // added in float32, rounded with the sum
  }
}

QuantPlan& QuantPlan::add(const at::Tensor& tiles, const at::Tensor& scales,
                          const c10::optional<at::Tensor>& zeros, int64_t out_features,
                          int64_t group, int64_t bits, const c10::optional<at::Tensor>& supers,
                          int64_t per_super) {
  PlanPart part;
  part.sh = shape_of(out_features, in_features_, group, bits);
  part.params = checked_params(tiles, scales, zeros, supers, per_super, part.sh);
  part.tiles = tiles;
  part.scales = scales;
  part.zeros = zeros.has_value() ? *zeros : at::Tensor();
  part.supers = supers.has_value() ? *supers : at::Tensor();
  part.col0 = out_features_;
  out_features_ += out_features;
  parts_->list.push_back(std::move(part));
  return *this;
}

at::Tensor QuantPlan::forward(const at::Tensor& x, bool exact) const {
  TORCH_CHECK(!parts_->list.empty(), "a quantized linear needs at least one matrix");
  TORCH_CHECK(x.device().is_cpu() && x.dim() >= 1 && x.size(-1) == in_features_,
              "x must be [..., ", in_features_, "] on the CPU");
  TORCH_CHECK(!bias_.defined() || bias_.numel() == out_features_,
              "the bias must be [", out_features_, "]");
  const int64_t rows = x.numel() / in_features_;
  TORCH_CHECK(rows <= kMaxRows, "a quantized linear takes at most ", kMaxRows, " rows");
  const at::Tensor input = x.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features_;
  at::Tensor out = at::empty(shape, x.options());
  const float* bias = bias_.defined() ? bias_.data_ptr<float>() : nullptr;
  switch (x.scalar_type()) {
    case at::kBFloat16:
      plan_impl(input.data_ptr<c10::BFloat16>(), rows, parts_->list, bias, true, out_features_,
                out.data_ptr<c10::BFloat16>());
      break;
    case at::kFloat:
      plan_impl(input.data_ptr<float>(), rows, parts_->list, bias, !exact, out_features_,
                out.data_ptr<float>());
      break;
    default:
      TORCH_CHECK(false, "a quantized linear takes bfloat16 or float32 inputs, not ", x.scalar_type());
  }
  return out;
}

void quant_dequant_tiles(const at::Tensor& tiles, const at::Tensor& scales,
                         const c10::optional<at::Tensor>& zeros, int64_t group, int64_t bits,
                         at::Tensor& out, const c10::optional<at::Tensor>& supers,
                         int64_t per_super) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) % kLanes == 0,
              "out must be a contiguous [T * 16, K_pad]");
  TORCH_CHECK(group <= kMaxGroup, "groups of at most ", kMaxGroup, " inputs");
  const Shape sh = shape_of(out.size(0), out.size(1), group, bits);
  TORCH_CHECK(sh.k_pad == out.size(1), "out's width must be a whole number of groups");
  const Params params = checked_params(tiles, scales, zeros, supers, per_super, sh);
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  const int64_t count = sh.n / kLanes;
  auto run = [&](auto* dst) {
    at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const Params p = params.tile(t, sh.groups);
        auto* rows = dst + t * kLanes * sh.k_pad;
        if (bits == 4) {
          dequant_tile<4>(w + t * sh.tile_bytes, p, sh, sh.k_pad, rows);
        } else if (bits == 6) {
          dequant_tile<6>(w + t * sh.tile_bytes, p, sh, sh.k_pad, rows);
        } else {
          dequant_tile<8>(w + t * sh.tile_bytes, p, sh, sh.k_pad, rows);
        }
      }
    });
  };
  on_float_out(out, "quant_dequant_tiles", run);
}

at::Tensor quant_rows(const at::Tensor& tiles, const at::Tensor& scales,
                      const c10::optional<at::Tensor>& zeros, const at::Tensor& ids,
                      int64_t out_features, int64_t in_features, int64_t group, int64_t bits,
                      at::ScalarType dtype, const c10::optional<at::Tensor>& supers,
                      int64_t per_super) {
  const Shape sh = shape_of(out_features, in_features, group, bits);
  const Params params = checked_params(tiles, scales, zeros, supers, per_super, sh);
  TORCH_CHECK(ids.scalar_type() == at::kLong, "ids must be int64");
  const at::Tensor flat = ids.contiguous().view(-1);
  const int64_t* id = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < out_features, "row id ", id[i], " is out of range");
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(in_features);
  at::Tensor out = at::empty(shape, tiles.options().dtype(dtype));
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  auto run = [&](auto* dst) {
    at::parallel_for(0, flat.numel(), 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t f = id[i], t = f / kLanes;
        dequant_feature(w + t * sh.tile_bytes, params.tile(t, sh.groups), f % kLanes, sh,
                        dst + i * in_features);
      }
    });
  };
  on_float_out(out, "quant_rows", run);
  return out;
}

}  // namespace hearth
