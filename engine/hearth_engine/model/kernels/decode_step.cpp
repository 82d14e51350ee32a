// A decode step's decoder layers in one call (decode_step.h): the same kernels and torch
// operations, in the same order, as the lean forward's Python loop (decoder.py's
// ``step_graph`` with its ``attend``), so the results are the same bits.
//
// Why: a one-token step of a small model is mostly calls, not arithmetic. Each layer is
// about fifteen operations (two norms, four linears, RoPE, the KV write, attention, the
// MLP's activation, two residual adds), and from Python each costs its interpreter and
// dispatch time while the second core waits at the next parallel region. Here the loop
// over layers and operations is C++.
//
// Python side: hearth_engine/model/native_step.py (builds it, calls it, falls back).

#include "decode_step.h"

#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>

#include "hearth_native.h"

namespace hearth {

StepLinear StepLinear::quant(const QuantPlan& plan) {
  StepLinear linear;
  linear.plan_ = std::make_shared<QuantPlan>(plan);
  linear.out_features_ = plan.out_features();
  return linear;
}

StepLinear StepLinear::tiled(const at::Tensor& tiles, int64_t out_features,
                             const c10::optional<at::Tensor>& scales,
                             const c10::optional<at::Tensor>& bias) {
  StepLinear linear;
  linear.tiles_ = tiles;
  linear.out_features_ = out_features;
  linear.scales_ = scales;
  linear.bias_ = bias;
  return linear;
}

at::Tensor StepLinear::operator()(const at::Tensor& x) const {
  if (plan_) return plan_->forward(x, /*exact=*/false);
  return tiled_linear(x, tiles_, out_features_, scales_, bias_);
}

DecodeLayers::DecodeLayers(int64_t heads, int64_t kv_heads, int64_t head_dim, double scale)
    : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), scale_(scale) {
  TORCH_CHECK(heads > 0 && kv_heads > 0 && head_dim > 0 && heads % kv_heads == 0,
              "decode layers: heads must be a positive multiple of KV heads");
}

void DecodeLayers::add_layer(const at::Tensor& in_norm, double in_eps, const StepLinear& qkv,
                             const StepLinear& o, const at::Tensor& post_norm, double post_eps,
                             const StepLinear& gate_up, const StepLinear& down,
                             const c10::optional<at::Tensor>& q_norm, double q_eps,
                             const c10::optional<at::Tensor>& k_norm, double k_eps) {
  TORCH_CHECK(qkv.out_features() == (heads_ + 2 * kv_heads_) * head_dim_,
              "decode layers: q/k/v must give (heads + 2 KV heads) x head size outputs");
  TORCH_CHECK(gate_up.out_features() % 2 == 0, "decode layers: gate/up must be two halves");
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(),
              "decode layers: q and k norms go together");
  layers_.push_back(Layer{in_norm, in_eps, qkv, o, post_norm, post_eps, gate_up, down,
                          q_norm.value_or(at::Tensor()), k_norm.value_or(at::Tensor()), q_eps,
                          k_eps});
}

namespace {

// decoder.py's rms_norm: the native kernel on a contiguous tensor, else torch's (float32
// normalise, round, then scale), as the Python loop picks.
at::Tensor head_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.is_contiguous()) return rms_norm(x, weight, eps);
  at::Tensor normed = at::rms_norm(x.to(at::kFloat), {x.size(-1)}, c10::nullopt, eps);
  return at::mul(weight, normed.to(x.scalar_type()));
}

}  // namespace

at::Tensor DecodeLayers::forward(const at::Tensor& hidden, const at::Tensor& cos,
                                 const at::Tensor& sin, const at::Tensor& kv, int64_t length,
                                 const c10::optional<at::Tensor>& keep,
                                 const std::vector<at::Tensor>& part_segments,
                                 const std::vector<c10::optional<at::Tensor>>& part_rows) const {
  const int64_t b = hidden.size(0), nq = heads_, nkv = kv_heads_, d = head_dim_;
  const int64_t count = static_cast<int64_t>(layers_.size());
  TORCH_CHECK(hidden.dim() == 3 && hidden.size(1) == 1 && hidden.is_contiguous(),
              "decode layers: hidden must be a contiguous [B, 1, width]");
  TORCH_CHECK(kv.dim() == 6 && kv.size(0) == count && kv.size(1) == 2 && kv.size(2) == b &&
                  kv.size(3) == nkv && kv.size(5) == d,
              "decode layers: the KV buffer must be [layers, 2, B, KV heads, capacity, D]");
  TORCH_CHECK(length >= 0 && length < kv.size(4), "decode layers: no KV column left to write");
  TORCH_CHECK(part_segments.size() == part_rows.size(), "decode layers: one row list per part");
  for (const at::Tensor& segment : part_segments) {
    TORCH_CHECK(segment.dim() == 5 && segment.size(0) == count && segment.size(1) == 2,
                "decode layers: a prefix part must be [layers, 2, KV heads, T, D]");
  }
  at::Tensor h = hidden;
  std::vector<at::Tensor> part_k(part_segments.size()), part_v(part_segments.size());
  for (int64_t l = 0; l < count; ++l) {
    const Layer& layer = layers_[l];
    // decoder.py: x = rms_norm(hidden); qkv = qkv(x).view(b, 1, nq + 2 nkv, d)
    at::Tensor x = rms_norm(h, layer.in_norm, layer.in_eps);
    at::Tensor qkv = layer.qkv(x).view({b, 1, nq + 2 * nkv, d});
    // q and k normed (Qwen3) and rotated apart, or rotated together; v as it is.
    at::Tensor q, k;
    if (layer.q_norm.defined()) {
      q = rope(head_norm(qkv.narrow(2, 0, nq), layer.q_norm, layer.q_eps), cos, sin);
      k = rope(head_norm(qkv.narrow(2, nq, nkv), layer.k_norm, layer.k_eps), cos, sin);
    } else {
      at::Tensor qk = rope(qkv.narrow(2, 0, nq + nkv), cos, sin);
      q = qk.narrow(2, 0, nq);
      k = qk.narrow(2, nq, nkv);
    }
    at::Tensor v = qkv.narrow(2, nq + nkv, nkv);
    // kv.py's BufferLayer.update: the new column, then the keys and values up to it.
    at::Tensor store = kv.select(0, l);  // [2, B, H, cap, D]
    at::Tensor keys = store.select(0, 0), values = store.select(0, 1);
    keys.narrow(2, length, 1).copy_(k.transpose(1, 2));
    values.narrow(2, length, 1).copy_(v.transpose(1, 2));
    keys = keys.narrow(2, 0, length + 1);
    values = values.narrow(2, 0, length + 1);
    for (size_t p = 0; p < part_segments.size(); ++p) {
      const at::Tensor held = part_segments[p].select(0, l);
      part_k[p] = held.select(0, 0);
      part_v[p] = held.select(0, 1);
    }
    // attention.py's native_decode: query [B, Hq, D] -> [B, Hq, D].
    at::Tensor out = decode_attention(q.select(1, 0), keys, values, keep, part_k, part_v,
                                      part_rows, scale_);
    h = at::add(h, layer.o(out.view({b, 1, nq * d})));
    x = rms_norm(h, layer.post_norm, layer.post_eps);
    std::vector<at::Tensor> halves = layer.gate_up(x).chunk(2, -1);
    h = at::add(h, layer.down(at::mul(at::silu(halves[0]), halves[1])));
  }
  return h;
}

}  // namespace hearth
