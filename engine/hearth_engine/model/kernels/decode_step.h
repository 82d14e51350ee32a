// A decode step's decoder layers in one native call (decode_step.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <memory>
#include <vector>

#include "quant_linear.h"

namespace hearth {

// One linear of a decode layer: a QuantPlan (weights kept 4-, 6- or 8-bit) or bfloat16,
// float32 or int8 decode tiles (decode_linear.cpp's tiled_linear).
class StepLinear {
 public:
  static StepLinear quant(const QuantPlan& plan);
  static StepLinear tiled(const at::Tensor& tiles, int64_t out_features,
                          const c10::optional<at::Tensor>& scales,
                          const c10::optional<at::Tensor>& bias);
  at::Tensor operator()(const at::Tensor& x) const;
  int64_t out_features() const { return out_features_; }

 private:
  std::shared_ptr<QuantPlan> plan_;
  at::Tensor tiles_;
  int64_t out_features_ = 0;
  c10::optional<at::Tensor> scales_;
  c10::optional<at::Tensor> bias_;
};

// The layers of a Llama-family decoder (full attention) for one-token steps: per layer
// RMSNorm, q/k/v, the q and k norms where the model has them (Qwen3), RoPE on q and k,
// the KV write at column ``length``, decode attention over the written KV and the prefix
// parts, o, the residual, RMSNorm, gate/up, SiLU(gate) * up, down, the residual.
class DecodeLayers {
 public:
  DecodeLayers(int64_t heads, int64_t kv_heads, int64_t head_dim, double scale);
  void add_layer(const at::Tensor& in_norm, double in_eps, const StepLinear& qkv,
                 const StepLinear& o, const at::Tensor& post_norm, double post_eps,
                 const StepLinear& gate_up, const StepLinear& down,
                 const c10::optional<at::Tensor>& q_norm, double q_eps,
                 const c10::optional<at::Tensor>& k_norm, double k_eps);
  // hidden [B, 1, width] (the embeddings); cos/sin [B, 1, 1, D]; kv the working buffer
  // [layers, 2, B, KV heads, capacity, D], written at column ``length``; keep [B,
  // length + 1] bool or None; each part a cached segment [layers, 2, KV heads, T, D] with
  // the rows that read it (None: all). Returns the last layer's hidden [B, 1, width].
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& kv, int64_t length, const c10::optional<at::Tensor>& keep,
                     const std::vector<at::Tensor>& part_segments,
                     const std::vector<c10::optional<at::Tensor>>& part_rows) const;
  int64_t layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  struct Layer {
    at::Tensor in_norm;
    double in_eps;
    StepLinear qkv, o;
    at::Tensor post_norm;
    double post_eps;
    StepLinear gate_up, down;
    at::Tensor q_norm, k_norm;  // undefined: none
    double q_eps, k_eps;
  };
  int64_t heads_, kv_heads_, head_dim_;
  double scale_;
  std::vector<Layer> layers_;
};

}  // namespace hearth
