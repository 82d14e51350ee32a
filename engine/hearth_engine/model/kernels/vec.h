// Vector helpers shared by Hearth's kernels: 16 float32 lanes in GCC/Clang vector
// extensions (one AVX-512 register; two AVX2 or four NEON ones, the compiler's choice),
// loads that widen bfloat16 / float16 / float32 to them, and a transpose-add tree that
// sums the lanes of 16 vectors at once.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace hearth::vec {

// 16 float32 lanes, 16 int32 lanes (masks, indices), 16 bfloat16 / float16 bit patterns.
typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef uint16_t h16v __attribute__((vector_size(32)));

#if defined(__clang__)
#define HEARTH_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define HEARTH_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (i16v){__VA_ARGS__})
#endif

constexpr int kLanes = 16;

// Decode calls stream their weights once a step. With the hardware's prefetchers alone,
// one row read a Qwen2.5-1.5B Q4_K_M file's linears at 14-16 GB/s where a float32 sum of
// as many bytes read 21-26 (2-vCPU Xeon). Asking for the bytes this far ahead (into the
// next tile at a tile's end: tiles are adjacent) cut the packed linears' time by 13-20 %
// for one row and 25-29 % for four, SmolLM2-135M's bfloat16 tiles' by 9 % and 20 %
// (1,024 to 2,048 bytes measured alike; 512 less, 4,096 no gain).
constexpr int64_t kPrefetchBytes = 1536;

// The bytes [p, p + bytes) kPrefetchBytes ahead, into the cache: a hint, which never
// faults (past the end of a buffer included).
inline void prefetch_ahead(const void* p, int64_t bytes) {
  const char* at = static_cast<const char*>(p) + kPrefetchBytes;
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(at + b, 0, 3);
}

inline f16v load(const float* p) {
  f16v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, f16v v) { std::memcpy(p, &v, sizeof(v)); }
inline f16v splat(float x) { return f16v{} + x; }

// 16 consecutive elements as float32.
inline f16v load16(const float* p) { return load(p); }
inline f16v load16(const c10::Half* p) {
  f16v out;
  for (int i = 0; i < kLanes; ++i) out[i] = static_cast<float>(p[i]);
  return out;
}
inline f16v load16(const int8_t* p) {
#if defined(__AVX512F__)  // GCC 13 turns the generic widening below into scalar code
  const __m512 wide = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(p))));
  f16v out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
#else
  f16v out;
  for (int i = 0; i < kLanes; ++i) out[i] = static_cast<float>(p[i]);
  return out;
#endif
}
inline f16v load16(const c10::BFloat16* p) {  // a bfloat16 is the top half of a float32
  h16v raw;
  std::memcpy(&raw, p, sizeof(raw));
  u16v wide = __builtin_convertvector(raw, u16v) << 16;
  f16v out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

inline float hmax(f16v v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}
inline float hsum(f16v v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// exp(x) for x <= 0, 16 lanes (Cephes' polynomial, about 1 ulp); below -87 clamps.
inline f16v exp16(f16v x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  i16v n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, i16v);  // round (x <= 0)
  f16v nf = __builtin_convertvector(n, f16v);
  f16v r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  f16v p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  f16v y = p * r * r + r + 1.0f;
  i16v bits = (n + 127) << 23;
  f16v scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// The dot products of a block of 16 keys come out as 16 vectors of partial sums; adding
// each one's lanes separately would cost a horizontal sum per key. A transpose-add tree
// does all 16 at once: each step pairs two vectors and adds lanes S apart (S = 8, 4,
// 2, 1), halving the vector count, until one vector holds the 16 sums.
#define HEARTH_COMB8(x, y)                                                        \
  (HEARTH_SHUFFLE(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) + \
   HEARTH_SHUFFLE(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
#define HEARTH_COMB4(x, y)                                                          \
  (HEARTH_SHUFFLE(x, y, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) + \
   HEARTH_SHUFFLE(x, y, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31))
#define HEARTH_COMB2(x, y)                                                          \
  (HEARTH_SHUFFLE(x, y, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) + \
   HEARTH_SHUFFLE(x, y, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31))
#define HEARTH_COMB1(x, y)                                                           \
  (HEARTH_SHUFFLE(x, y, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) + \
   HEARTH_SHUFFLE(x, y, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31))

// Lane j of the result is the sum of the lanes of a[kBitrev[j]] (the tree's pairing
// leaves the sums in bit-reversed order: a[i]'s sum lands in lane kBitrev[i]).
inline f16v sum_lanes(const f16v* a) {
  f16v b0 = HEARTH_COMB8(a[0], a[1]), b1 = HEARTH_COMB8(a[2], a[3]), b2 = HEARTH_COMB8(a[4], a[5]),
       b3 = HEARTH_COMB8(a[6], a[7]);
  f16v b4 = HEARTH_COMB8(a[8], a[9]), b5 = HEARTH_COMB8(a[10], a[11]),
       b6 = HEARTH_COMB8(a[12], a[13]), b7 = HEARTH_COMB8(a[14], a[15]);
  f16v c0 = HEARTH_COMB4(b0, b1), c1 = HEARTH_COMB4(b2, b3), c2 = HEARTH_COMB4(b4, b5),
       c3 = HEARTH_COMB4(b6, b7);
  f16v d0 = HEARTH_COMB2(c0, c1), d1 = HEARTH_COMB2(c2, c3);
  return HEARTH_COMB1(d0, d1);
}
constexpr int kBitrev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

}  // namespace hearth::vec
