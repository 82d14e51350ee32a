// A linear layer for the few rows of a decode step: y = x W^T (+ b) for x [M, K] with
// M <= 16, from weights re-laid out once as tiles of 16 output features. Float32 sums,
// one rounding.
//
// Python side: hearth_engine/linear.py (FrozenLinear, the caller) and native.py (build).
//
// A decode step multiplies one row per running sequence by every weight matrix: it is
// bound by how fast the weights stream from memory, and on a small model also by what
// each call costs besides. Measured on a 2-core EPYC (AVX512-BF16), SmolLM2-135M's 120
// layer matrices in bfloat16: oneDNN's packed linear streams them at 16-19 GB/s and
// spends about 17 us per call before reading a byte; torch's plain linear 14 GB/s. This
// kernel streams them at 28-30 GB/s for one row, and a call costs 1-2 us.
//
// Layout (tile_weight): tile t holds features 16t..16t+15, the last one zero-padded.
// * bfloat16: [T, K/2, 16, 2]: for each pair of inputs, the 16 features' two weights
//   side by side: one 64-byte load feeds one AVX512-BF16 dot-product instruction (or,
//   without it, two float32 multiply-adds after widening);
// * float32 and int8 (with a float scale per feature): [T, K, 16].
// So a tile is one contiguous run of memory, read front to back, and its 16 sums need no
// horizontal additions. A tile is computed for up to 8 input rows at a time: each weight
// is read from memory once and reused from registers for the others. Tiles run in
// parallel over the intra-op threads once the matrix is big enough to be worth waking
// them.

// Only what the kernels use (not <torch/extension.h>, which only the bindings in
// module.cpp need): parsing all of torch's headers once per file took most of the build.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hearth_native.h"
#include "vec.h"

namespace {

using namespace hearth::vec;  // NOLINT(build/namespaces): the kernels' vocabulary

constexpr int64_t kMaxRows = 16;
constexpr int64_t kSerialBytes = 128 * 1024;  // smaller matrices: the calling thread only
constexpr int64_t kTaskBytes = 64 * 1024;     // weight bytes per parallel task, at least
// Independent accumulators per tile: a multiply-add waits ~4 cycles for the one before it
// into the same register, so fewer rows are spread over more registers (split inputs).
template <int MB>
constexpr int kSplits = MB >= 8 ? 1 : 8 / MB;

inline f16v bits_to_float(u16v bits) {
  f16v out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline float bf16_bits_to_float(uint32_t bits) {
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Sums of one [K, 16] tile (float32 or int8 weights) against MB rows of xf ([MB, k]).
template <typename W, int MB>
void tile_singles(const W* w, const float* xf, int64_t k, float* sums) {
  constexpr int U = kSplits<MB>;
  f16v acc[U][MB] = {};
  int64_t c = 0;
  constexpr int64_t kPerLine = 64 / (kLanes * sizeof(W));  // steps a cache line holds
  for (; c + U <= k; c += U) {
    for (int u = 0; u < U; ++u) {
      if ((c + u) % kPerLine == 0) prefetch_ahead(w + (c + u) * kLanes, 64);
      const f16v wv = load16(w + (c + u) * kLanes);
      for (int m = 0; m < MB; ++m) acc[u][m] += wv * xf[m * k + c + u];
    }
  }
  for (; c < k; ++c) {
    const f16v wv = load16(w + c * kLanes);
    for (int m = 0; m < MB; ++m) acc[0][m] += wv * xf[m * k + c];
  }
  for (int m = 0; m < MB; ++m) {
    for (int u = 1; u < U; ++u) acc[0][m] += acc[u][m];
    store(sums + m * kLanes, acc[0][m]);
  }
}

// Sums of one [K/2, 16, 2] bfloat16 tile against MB rows of input pairs (xp: [MB, k2],
// each uint32 two bfloat16 inputs, the even one in the low half, as in memory).
template <int MB>
void tile_pairs(const c10::BFloat16* w, const uint32_t* xp, int64_t k2, float* sums) {
  constexpr int U = kSplits<MB>;
#if defined(__AVX512BF16__)
  __m512 acc[U][MB];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m) acc[u][m] = _mm512_setzero_ps();
  auto step = [&](int u, int64_t c) {
    prefetch_ahead(w + c * 2 * kLanes, 64);
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + c * 2 * kLanes);
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * k2 + c]));
      acc[u][m] = _mm512_dpbf16_ps(acc[u][m], wv, xv);
    }
  };
  int64_t c = 0;
  for (; c + U <= k2; c += U)
    for (int u = 0; u < U; ++u) step(u, c + u);
  for (; c < k2; ++c) step(0, c);
  for (int m = 0; m < MB; ++m) {
    for (int u = 1; u < U; ++u) acc[0][m] = _mm512_add_ps(acc[0][m], acc[u][m]);
    _mm512_storeu_ps(sums + m * kLanes, acc[0][m]);
  }
#else
  // Lane f of a pair vector holds feature f's two weights: the even input's in the low
  // half, the odd one's in the high half; each is a float32 once moved to the top.
  f16v acc[U][MB] = {};
  auto step = [&](int u, int64_t c) {
    prefetch_ahead(w + c * 2 * kLanes, 64);
    u16v raw;
    std::memcpy(&raw, w + c * 2 * kLanes, sizeof(raw));
    const f16v even = bits_to_float(raw << 16), odd = bits_to_float(raw & 0xFFFF0000u);
    for (int m = 0; m < MB; ++m) {
      const uint32_t pair = xp[m * k2 + c];
      acc[u][m] +=
          even * bf16_bits_to_float(pair << 16) + odd * bf16_bits_to_float(pair & 0xFFFF0000u);
    }
  };
  int64_t c = 0;
  for (; c + U <= k2; c += U)
    for (int u = 0; u < U; ++u) step(u, c + u);
  for (; c < k2; ++c) step(0, c);
  for (int m = 0; m < MB; ++m) {
    for (int u = 1; u < U; ++u) acc[0][m] += acc[u][m];
    store(sums + m * kLanes, acc[0][m]);
  }
#endif
}

template <typename T, typename W, bool Pairs>
void linear_tiles(const at::Tensor& x, const at::Tensor& tiles, const at::Tensor& scales,
                  const at::Tensor& bias, at::Tensor& out) {
  const int64_t k = x.size(-1), rows = x.numel() / k, n_out = out.size(-1);
  const int64_t depth = tiles.size(1);  // K (singles) or K/2 rounded up (pairs)
  const T* xs = x.data_ptr<T>();
  std::vector<float> xf;
  std::vector<uint32_t> xp;
  if constexpr (Pairs) {
    xp.assign(rows * depth, 0);
    for (int64_t m = 0; m < rows; ++m)
      std::memcpy(xp.data() + m * depth, xs + m * k, k * sizeof(T));
  } else {
    xf.resize(rows * k);
    for (int64_t i = 0; i < rows * k; ++i) xf[i] = static_cast<float>(xs[i]);
  }
  const int64_t tile_elems = tiles.numel() / tiles.size(0);
  const W* wbase = tiles.data_ptr<W>();
  const T* scale = scales.defined() ? scales.data_ptr<T>() : nullptr;
  const T* b = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* dst = out.data_ptr<T>();

  auto run_tiles = [&](int64_t begin, int64_t end) {
    float sums[8 * kLanes];
    for (int64_t t = begin; t < end; ++t) {
      const W* w = wbase + t * tile_elems;
      for (int64_t m0 = 0; m0 < rows;) {
        const int64_t left = rows - m0;
        const int mb = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        if constexpr (Pairs) {
          const uint32_t* xm = xp.data() + m0 * depth;
          switch (mb) {
            case 8:
              tile_pairs<8>(w, xm, depth, sums);
              break;
            case 4:
              tile_pairs<4>(w, xm, depth, sums);
              break;
            case 2:
              tile_pairs<2>(w, xm, depth, sums);
              break;
            default:
              tile_pairs<1>(w, xm, depth, sums);
          }
        } else {
          const float* xm = xf.data() + m0 * k;
          switch (mb) {
            case 8:
              tile_singles<W, 8>(w, xm, k, sums);
              break;
            case 4:
              tile_singles<W, 4>(w, xm, k, sums);
              break;
            case 2:
              tile_singles<W, 2>(w, xm, k, sums);
              break;
            default:
              tile_singles<W, 1>(w, xm, k, sums);
          }
        }
        for (int m = 0; m < mb; ++m) {
          for (int64_t f = t * kLanes; f < std::min(n_out, (t + 1) * kLanes); ++f) {
            float s = sums[m * kLanes + f - t * kLanes];
            if (scale != nullptr) s *= static_cast<float>(scale[f]);
            if (b != nullptr) s += static_cast<float>(b[f]);
            dst[(m0 + m) * n_out + f] = static_cast<T>(s);
          }
        }
        m0 += mb;
      }
    }
  };
  const int64_t count = tiles.size(0);
  const int64_t tile_bytes = tile_elems * static_cast<int64_t>(tiles.element_size());
  if (count * tile_bytes < kSerialBytes) {
    run_tiles(0, count);
  } else {
    at::parallel_for(0, count, std::max<int64_t>(1, kTaskBytes / tile_bytes), run_tiles);
  }
}

}  // namespace

namespace hearth {

at::Tensor tile_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "tile_weight takes a weight [N, K]");
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kChar,
              "tile_weight takes bfloat16, float32 or int8 weights, not ", dtype);
  const int64_t n = weight.size(0), k = weight.size(1), tiles = (n + kLanes - 1) / kLanes;
  if (dtype == at::kBFloat16) {
    const int64_t k2 = (k + 1) / 2;
    at::Tensor padded = at::zeros({tiles * kLanes, k2 * 2}, weight.options());
    padded.narrow(0, 0, n).narrow(1, 0, k).copy_(weight);
    return padded.view({tiles, kLanes, k2, 2}).permute({0, 2, 1, 3}).contiguous();
  }
  at::Tensor padded = at::zeros({tiles * kLanes, k}, weight.options());
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({tiles, kLanes, k}).transpose(1, 2).contiguous();
}

at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& tiles, int64_t out_features,
                        const c10::optional<at::Tensor>& scales,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && tiles.device().is_cpu(), "tiled_linear runs on the CPU");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x must be [..., K]");
  TORCH_CHECK(tiles.is_contiguous() && out_features > 0 &&
                  tiles.size(0) == (out_features + kLanes - 1) / kLanes,
              "tiles must come from tile_weight for this many features");
  const int64_t k = x.size(-1);
  TORCH_CHECK(x.numel() / k <= kMaxRows, "tiled_linear takes at most ", kMaxRows, " rows");
  const auto wtype = tiles.scalar_type();
  const bool pairs = wtype == at::kBFloat16;
  if (pairs) {
    TORCH_CHECK(tiles.dim() == 4 && tiles.size(1) == (k + 1) / 2 && tiles.size(2) == kLanes &&
                    tiles.size(3) == 2,
                "bfloat16 tiles must be [T, K/2, 16, 2] for this K");
  } else {
    TORCH_CHECK(tiles.dim() == 3 && tiles.size(1) == k && tiles.size(2) == kLanes,
                "tiles must be [T, K, 16] for this K");
  }
  TORCH_CHECK(wtype == at::kChar || wtype == x.scalar_type(),
              "tiles must have x's dtype, or be int8");
  TORCH_CHECK((wtype == at::kChar) == scales.has_value(),
              "int8 tiles take scales (and only they do)");
  at::Tensor scale, b;
  if (scales.has_value()) {
    TORCH_CHECK(scales->device().is_cpu(), "scales must be on the CPU");
    scale = scales->contiguous();
    TORCH_CHECK(scale.scalar_type() == x.scalar_type() && scale.numel() == out_features,
                "scales must be [N] in x's dtype");
  }
  if (bias.has_value()) {
    TORCH_CHECK(bias->device().is_cpu(), "the bias must be on the CPU");
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == x.scalar_type() && b.numel() == out_features,
                "the bias must be [N] in x's dtype");
  }
  const at::Tensor input = x.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  at::Tensor out = at::empty(shape, x.options());
  switch (x.scalar_type()) {
    case at::kBFloat16:
      if (pairs) {
        linear_tiles<c10::BFloat16, c10::BFloat16, true>(input, tiles, scale, b, out);
      } else {
        linear_tiles<c10::BFloat16, int8_t, false>(input, tiles, scale, b, out);
      }
      break;
    case at::kFloat:
      if (wtype == at::kChar) {
        linear_tiles<float, int8_t, false>(input, tiles, scale, b, out);
      } else {
        linear_tiles<float, float, false>(input, tiles, scale, b, out);
      }
      break;
    default:
      TORCH_CHECK(false, "tiled_linear takes bfloat16 or float32 inputs, not ", x.scalar_type());
  }
  return out;
}

}  // namespace hearth
