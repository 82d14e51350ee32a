// Hearth's native CPU kernels (built by hearth_engine/native.py; bound in module.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <tuple>
#include <vector>

namespace hearth {

// decode_attention.cpp: attention of one query token per row over the rows' own KV and
// shared prefix parts. query [B, Hq, D]; own_k/own_v [B, Hkv, S, D]; own_keep [B, S]
// bool or None; part_k/part_v [Hkv, T, D] each; part_rows: int64 row indices (empty: no
// row reads the part, as in torch's path), or None for all rows. Returns [B, Hq, D] in
// the query's dtype. Refuses (a Python RuntimeError) what it cannot take.
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& own_k,
                            const at::Tensor& own_v, const c10::optional<at::Tensor>& own_keep,
                            const std::vector<at::Tensor>& part_k,
                            const std::vector<at::Tensor>& part_v,
                            const std::vector<c10::optional<at::Tensor>>& part_rows,
                            double scale);

// Whether decode_attention's bfloat16 products run on AMX tiles (attention_amx.h): on by
// default where the build and the OS allow it; ``on`` false keeps the vector path (tests
// compare the two). Returns whether the tiles are now in use.
bool use_attention_amx(bool on);
bool attention_amx();

// prefix_attention.cpp: attention of many queries over one cached prefix part, no mask
// (or, with causal_tokens Q, a chunk's own Q tokens over their own keys, causal), in
// bfloat16 dot products, or in float32 (prefix_f32.h). query [H, N, D], keys/values
// [H, T, D], all bfloat16 or all float32, with the last dimension contiguous. Returns the
// output [H, N, D] and log-sum-exp [H, N] in float32 (a partial for attention.py's
// merge). prefix_attention_ready: whether this build has the bfloat16 kernel
// (AVX512-BF16); a dtype whose kernel is not built is refused.
bool prefix_attention_ready();
// The float32 kernel (prefix_f32.h, AVX2 and FMA): built; and first, ahead of torch's
// flash kernel (a build without AVX-512, where torch's kernel would be no wider).
bool prefix_attention_f32_ready();
bool prefix_attention_f32_first();
std::tuple<at::Tensor, at::Tensor> prefix_attention(const at::Tensor& query,
                                                    const at::Tensor& keys,
                                                    const at::Tensor& values, double scale,
                                                    int64_t causal_tokens = 0);

// decode_linear.cpp: a linear for a decode step's few rows, from weights re-laid out
// once. tile_weight: weight [N, K] (bfloat16, float32 or int8) as tiles of 16 features.
// tiled_linear: y = x W^T (+ bias) for x [..., K] with at most 16 rows, in x's dtype;
// int8 tiles take scales [N] (W = q * scales[:, None]); bias [N].
at::Tensor tile_weight(const at::Tensor& weight);
at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& tiles, int64_t out_features,
                        const c10::optional<at::Tensor>& scales,
                        const c10::optional<at::Tensor>& bias);

// layer_ops.cpp: the small per-layer operations of a decode step, fused.
// transformers' Llama RMSNorm: normalise in float32, round to x's dtype, scale by weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// Rotary embedding of x [B, Q, H, D] (last dimension contiguous) with cos/sin [B, Q, 1, D]
// (rotate-half form), rounded as torch's three operations would be. Returns a new tensor.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace hearth
