// Hearth's quantized linears (quant_linear.cpp): weights kept as 4-, 6- or 8-bit tiles of
// 16 output features with float16 scales (and zeros) per group, or int8 factors of
// float16 super-scales (``supers`` [T, GS, Z, 16], ``per_super`` groups each); see that
// file's header.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <memory>
#include <string>

namespace hearth {

// One linear of one or more quantized matrices that read the same input (q/k/v,
// gate/up), built once: a call quantizes the rows once per group size, runs every
// matrix's tiles in one parallel region and writes their outputs side by side, with the
// bias added in float32 before the one rounding. For decode steps and prefill chunks.
class QuantPlan {
 public:
  QuantPlan(int64_t in_features, const c10::optional<at::Tensor>& bias);
  // The next matrix W [out_features, K] (its outputs follow the previous ones').
  QuantPlan& add(const at::Tensor& tiles, const at::Tensor& scales,
                 const c10::optional<at::Tensor>& zeros, int64_t out_features, int64_t group,
                 int64_t bits, const c10::optional<at::Tensor>& supers, int64_t per_super);
  // y = x W^T (+ bias) for x [..., K] (bfloat16 or float32), the parts' outputs side by
  // side, where W[f, k] = scales[f, k / group] * q[f, k] (+ zeros[f, k / group]). The rows
  // are quantized to int8 per group (integer dots); float32 rows with ``exact`` are not.
  at::Tensor forward(const at::Tensor& x, bool exact) const;
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_ = 0;
  at::Tensor bias_;  // float32, or undefined
  struct Parts;  // the matrices (quant_linear.cpp)
  std::shared_ptr<Parts> parts_;
};

// W as the padded [T * 16, K_pad] matrix, a tile at a time (prefill): bfloat16 or float32.
void quant_dequant_tiles(const at::Tensor& tiles, const at::Tensor& scales,
                         const c10::optional<at::Tensor>& zeros, int64_t group, int64_t bits,
                         at::Tensor& out, const c10::optional<at::Tensor>& supers,
                         int64_t per_super);

// The integer dot products this build has: "avx512_vnni", "avx2", "arm_dotprod" or
// "generic" (quant/linear.py's prefill_path reads it).
std::string quant_dots();

// Rows ids of W (an embedding lookup): [*ids.shape, K] in dtype.
at::Tensor quant_rows(const at::Tensor& tiles, const at::Tensor& scales,
                      const c10::optional<at::Tensor>& zeros, const at::Tensor& ids,
                      int64_t out_features, int64_t in_features, int64_t group, int64_t bits,
                      at::ScalarType dtype, const c10::optional<at::Tensor>& supers,
                      int64_t per_super);

}  // namespace hearth
