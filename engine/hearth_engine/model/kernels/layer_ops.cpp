// The small per-layer operations of a decode step, each one call instead of torch's four
// or five (on a 2-core CPU a one-token RMSNorm cost 18 us through torch's operators, most
// of it dispatch). Same arithmetic and the same roundings as the torch code they replace
// (hearth_engine/decoder.py): float32 inside, rounded to the tensor's dtype where torch
// rounds. Python side: decoder.py (callers), native.py (build).

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>

#include "hearth_native.h"

namespace {

template <typename T>
inline float widen(T x) {
  return static_cast<float>(x);
}

template <typename T>
inline T narrow(float x) {  // round to nearest even, as torch's casts do
  return static_cast<T>(x);
}

template <typename T>
void rms_norm_rows(const T* x, const T* weight, T* out, int64_t rows, int64_t width, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = x + r * width;
    T* dst = out + r * width;
    float sum = 0.0f;
    for (int64_t i = 0; i < width; ++i) sum += widen(src[i]) * widen(src[i]);
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
    for (int64_t i = 0; i < width; ++i) {
      const T normed = narrow<T>(widen(src[i]) * inv);
      dst[i] = narrow<T>(widen(weight[i]) * widen(normed));
    }
  }
}

template <typename T>
void rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  const int64_t b = x.size(0), q = x.size(1), h = x.size(2), d = x.size(3), half = d / 2;
  const T* c = cos.data_ptr<T>();
  const T* s = sin.data_ptr<T>();
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < q; ++j) {
      const T* ci = c + (i * q + j) * d;
      const T* si = s + (i * q + j) * d;
      for (int64_t k = 0; k < h; ++k) {
        const T* v = src + i * x.stride(0) + j * x.stride(1) + k * x.stride(2);
        T* o = dst + ((i * q + j) * h + k) * d;
        for (int64_t e = 0; e < d; ++e) {
          // torch: x * cos + cat(-x[half:], x[:half]) * sin, each product rounded, then the sum.
          const float rotated = e < half ? -widen(v[e + half]) : widen(v[e - half]);
          const T a = narrow<T>(widen(v[e]) * widen(ci[e]));
          const T r = narrow<T>(rotated * widen(si[e]));
          o[e] = narrow<T>(widen(a) + widen(r));
        }
      }
    }
  }
}

}  // namespace

namespace hearth {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "rms_norm takes a contiguous CPU tensor");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "rms_norm: x must be [..., width], width > 0");
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == x.scalar_type() &&
                  weight.is_contiguous() && weight.numel() == x.size(-1),
              "rms_norm: the weight must match the last dimension, dtype and device");
  at::Tensor out = at::empty_like(x);
  const int64_t width = x.size(-1), rows = x.numel() / width;
  switch (x.scalar_type()) {
    case at::kBFloat16:
      rms_norm_rows(x.data_ptr<c10::BFloat16>(), weight.data_ptr<c10::BFloat16>(),
                    out.data_ptr<c10::BFloat16>(), rows, width, static_cast<float>(eps));
      break;
    case at::kFloat:
      rms_norm_rows(x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), rows,
                    width, static_cast<float>(eps));
      break;
    default:
      TORCH_CHECK(false, "rms_norm takes bfloat16 or float32, not ", x.scalar_type());
  }
  return out;
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1 && x.device().is_cpu(),
              "rope takes x [B, Q, H, D], contiguous in D, on the CPU");
  TORCH_CHECK(x.size(3) > 0 && x.size(3) % 2 == 0, "rope needs an even, non-zero head size");
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->device().is_cpu(), "rope: cos and sin must be on the CPU");
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->is_contiguous() && t->dim() == 4 &&
                    t->size(0) == x.size(0) && t->size(1) == x.size(1) && t->size(2) == 1 &&
                    t->size(3) == x.size(3),
                "rope: cos and sin must be contiguous [B, Q, 1, D] of x's dtype");
  }
  at::Tensor out = at::empty({x.size(0), x.size(1), x.size(2), x.size(3)}, x.options());
  switch (x.scalar_type()) {
    case at::kBFloat16:
      rope_rows<c10::BFloat16>(x, cos, sin, out);
      break;
    case at::kFloat:
      rope_rows<float>(x, cos, sin, out);
      break;
    default:
      TORCH_CHECK(false, "rope takes bfloat16 or float32, not ", x.scalar_type());
  }
  return out;
}

}  // namespace hearth
