// Whether the tensor an in-place op writes shares memory with itself or with another argument, decided from
// sizes, strides and storage offsets for any layout. PyTorch's at::has_internal_overlap and
// at::get_overlap_status answer "too hard" for every tensor that is not dense (a slice of heads, a transposed
// view, K and V interleaved in one buffer); taken as "no", that let overlapping outputs through, and taken as
// "yes" it would refuse layouts that serving code uses (k_cache = kv[:, 0], v_cache = kv[:, 1]).
#pragma once

#include <ATen/core/Tensor.h>

namespace attn_ops {

// Two different elements of `t` at one address (a dim of size > 1 with stride 0, as expand() makes, or strides
// that make rows overlap).
bool shares_elements(const at::Tensor& t);

// An element of `a` and an element of `b` share a byte (same storage only; any dtypes).
bool shares_memory(const at::Tensor& a, const at::Tensor& b);

}  // namespace attn_ops
