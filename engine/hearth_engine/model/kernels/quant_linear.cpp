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
// Decode and prefill rows (QuantPlan):
// * the integer path (bfloat16 and float32 inputs): each row is quantized per group to
//   int8 (scale = max|x| / 127, round half to even), the group's dot products are exact
//   int32 sums (vpdpbusd with AVX-512 VNNI, vpmaddubsw + vpmaddwd with AVX2, Arm's SDOT,
//   or generic vector code; 6-bit: of the stored codes, less 32 x the group's input sum),
//   then y += s * (x_scale * dot) + z * sum(x) in float32, as llama.cpp does with its q8
//   activations (the tests measure the error: ``emulate``). One row of a 1536 x 8960 int4
//   matrix read at 17 GB/s on a 2-core AVX2 EPYC, against 3 for the float path. A prefill
//   chunk's rows take it too, each tile read once a slice of rows whose inputs fit L1: on
//   a 2-vCPU VNNI Xeon about 200 GMAC/s against 100-130 for a dequantized float32 GEMM.
// * the exact path (float32 inputs, ``exact``): the weights are widened to float and the
//   sums are float32 (no activation rounding), for tests.
// The dense prefill (quant_dequant_tiles) dequantizes whole tiles into a scratch matrix
// for one GEMM (quant_dequant.h): for AMX's bfloat16 tiles, the exact self-test's rows,
// and where the integer path is not the faster (quant/linear.py's prefill_path).
//
// The instruction-set paths are files of their own: quant_avx512.h (AVX-512: the rows'
// quantization, VNNI dot products, the prefill's stores), quant_avx2.h (AVX2: dot
// products, the prefill's unpacking and stores), quant_neon.h (Arm's SDOT) and
// quant_generic.h (any other CPU); their shared vocabulary is quant_common.h. This file
// holds the decode path's tiles and plans, and the functions that quant_linear.h declares.

// Only what the kernels use (not <torch/extension.h>, which only the bindings in
// module.cpp need): parsing all of torch's headers once per file took most of the build.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "quant_avx2.h"    // HEARTH_QAVX2: vpmaddubsw dot products (AVX2 hosts)
#include "quant_avx512.h"  // HEARTH_QVNNI: vpdpbusd dot products (AVX-512 VNNI)
#include "quant_common.h"
#include "quant_dequant.h"
#include "quant_generic.h"
#include "quant_linear.h"
#include "quant_neon.h"  // HEARTH_QDOT: Arm's SDOT (aarch64 with the dot-product extension)
#include "vec.h"

namespace {

using namespace hearth::quant;  // NOLINT(build/namespaces): the tiles' vocabulary

constexpr int64_t kMaxRows = 1 << 16;  // a sanity bound (prefill chunks are 256 rows)
constexpr int64_t kBlockRows = 8;              // rows that share one read of a tile
// Rows in one kernel call's registers: AVX2's 16 registers of 32 bytes hold two rows'
// sums (at eight group_dots kept them on the stack); AVX-512's 32 of 64 bytes hold eight.
#if defined(HEARTH_QAVX2)
constexpr int kRegisterRows = 2;
#else
constexpr int kRegisterRows = 8;
#endif
constexpr int64_t kSerialBytes = 96 * 1024;    // smaller matrices: the calling thread only
constexpr int64_t kTaskBytes = 48 * 1024;      // weight bytes per parallel task, at least
constexpr int64_t kParallelInputs = 64 * 1024;  // rows x inputs quantized on one thread, at most
// The int8 inputs a slice of rows keeps in L1 across a task's tiles (16 rows of 1,536
// inputs, 40 of 576): at 85 rows, 130 KB of inputs went through L2 once per tile before.
constexpr int64_t kSliceInputs = 24 * 1024;

// Rows a slice, in whole register blocks. AVX2 takes all in one pass (no gain measured:
// its products are slower than L2), as does the exact float path.
inline int64_t row_slice(int64_t rows, int64_t k_pad, bool integer) {
#if defined(HEARTH_QAVX2)
  return rows;
#else
  return integer ? std::max<int64_t>(kBlockRows, kSliceInputs / k_pad / kBlockRows * kBlockRows)
                 : rows;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
using hearth::quant_avx512::quantize_group;
#else
using hearth::quant_generic::quantize_group;
#endif

template <typename T>
QuantRows quantize_rows(const T* x, int64_t rows, const Shape& sh) {
  QuantRows r;
  r.q.assign(rows * sh.k_pad, 0);
  r.scale.resize(rows * sh.groups);
  r.sum.resize(rows * sh.groups);
  r.qsum.resize(rows * sh.groups);
  const auto quantize = [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      for (int64_t g = 0; g < sh.groups; ++g) {
        const int64_t k0 = g * sh.group, k1 = std::min(sh.k, k0 + sh.group);
        const int64_t at = m * sh.groups + g;
        quantize_group(x + m * sh.k + k0, k1 - k0, &r.scale[at], &r.sum[at],
                       &r.q[m * sh.k_pad + k0], &r.qsum[at]);
      }
    }
  };
  // A decode step's few rows on the calling thread; a prefill chunk's over the threads.
  if (rows * sh.k < kParallelInputs) {
    quantize(0, rows);
  } else {
    at::parallel_for(0, rows, std::max<int64_t>(1, kParallelInputs / sh.k), quantize);
  }
  if (sh.bits == 8) r.add_unsigned();
  return r;
}

// Group g's exact int32 dot products for MB rows starting at row0 (6-bit: less the codes'
// +32 offset), by the host's kernel.
template <int Bits, int MB>
inline void group_dots(const uint8_t* wg, const QuantRows& xr, int64_t row0, const Shape& sh,
                       int64_t g, i16v* dots) {
#if defined(HEARTH_QVNNI)
  hearth::quant_avx512::group_dots<Bits, MB>(wg, xr, row0, sh.k_pad, g * sh.group, sh.group,
                                             dots);
#elif defined(HEARTH_QAVX2)
  hearth::quant_avx2::group_dots<Bits, MB>(wg, xr.q.data() + row0 * sh.k_pad, sh.k_pad,
                                           g * sh.group, sh.group, dots);
#elif defined(HEARTH_QDOT)
  hearth::quant_neon::group_dots<Bits, MB>(wg, xr.q.data() + row0 * sh.k_pad, sh.k_pad,
                                           g * sh.group, sh.group, dots);
#else
  hearth::quant_generic::group_dots<Bits, MB>(wg, xr.q.data() + row0 * sh.k_pad, sh.k_pad,
                                              g * sh.group, sh.group, dots);
#endif
  if constexpr (Bits == 6) {
    for (int m = 0; m < MB; ++m) dots[m] -= 32 * xr.qsum[(row0 + m) * sh.groups + g];  // q + 32
  }
}

// Integer path: the sums of one tile for MB rows starting at row0 (sums: [MB, 16]).
template <int Bits, int MB>
void tile_int(const uint8_t* w, const Params& p, const QuantRows& xr, int64_t row0,
              const Shape& sh, float* sums) {
#if defined(HEARTH_QAVX2)
  if (p.wide != nullptr) {  // a chunk's rows (part_tiles widened the scales)
    return hearth::quant_avx2::tile_int_wide<Bits, MB>(w, p, xr, row0, sh, sums);
  }
#endif
#if defined(HEARTH_QVNNI)
  if constexpr (Bits == 4) {
    if (p.per == 0) return hearth::quant_avx512::tile_int4<MB>(w, p, xr, row0, sh, sums);
  }
#endif
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
#if defined(HEARTH_QAVX2)
  // AVX2's integer path takes rows two at a time: a tile's scales and zeros (two-level:
  // the products with their super-scales) are widened once for all of them.
  std::vector<float> wide;
  const bool widen = integer && rows > 2;
  if (widen) wide.resize(sh.groups * 2 * kLanes);
#endif
  const int64_t slice = row_slice(rows, sh.k_pad, integer);  // rows [r0, r1) a pass over tiles
  for (int64_t r0 = 0; r0 < rows; r0 += slice) {
    const int64_t r1 = std::min(rows, r0 + slice);
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* w = wbase + t * sh.tile_bytes;
      Params p = part.params.tile(t, sh.groups);
#if defined(HEARTH_QAVX2)
      if (widen) p.wide = hearth::quant_avx2::widen(p, sh.groups, wide.data());
#endif
      for (int64_t m0 = r0; m0 < r1;) {
        const int64_t left = r1 - m0;
        const int mb = std::min<int>(kRegisterRows, left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1);
        if (sh.bits == 4) dispatch_block<4>(mb, integer, w, p, a.xr, a.xf, a.xsum, m0, sh, sums);
        else if (sh.bits == 6) dispatch_block<6>(mb, integer, w, p, a.xr, a.xf, a.xsum, m0, sh, sums);
        else dispatch_block<8>(mb, integer, w, p, a.xr, a.xf, a.xsum, m0, sh, sums);
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

std::string quant_dots() {
#if defined(HEARTH_QVNNI)
  return "avx512_vnni";
#elif defined(HEARTH_QAVX2)
  return "avx2";
#elif defined(HEARTH_QDOT)
  return "arm_dotprod";
#else
  return "generic";
#endif
}

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
