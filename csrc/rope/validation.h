// Argument checks of rotary_embedding / rotary_embedding_, shared by every backend (CPU, CUDA, Meta).
#pragma once

#include <ATen/core/Tensor.h>

namespace attn_ops {

// x has at most this many dimensions (the leading ones index tokens; the CUDA kernel walks them itself).
constexpr int64_t kRotaryMaxDims = 8;

// x [..., heads, head_dim], positions int32/int64 [...] (x's leading dims), cos/sin [max_positions, rotary_dim / 2]
// in float32 or x's dtype. `op` names the op in messages. Position values are checked when they hold data.
void check_rotary_inputs(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& positions);

// The checks of rotary_embedding_: those above, and x (written in place) shares memory with neither itself
// nor cos, sin or positions.
void check_rotary_inplace_inputs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& positions);

}  // namespace attn_ops
