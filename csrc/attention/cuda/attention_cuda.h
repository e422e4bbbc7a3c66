// Host entry points of the CUDA attention kernels, called by the backend functions (attention_cuda.cu). Every
// launcher runs on the current stream and synchronises nothing.
#pragma once

#include "attention/cuda/problem.cuh"

#include <ATen/core/Tensor.h>

namespace attn_ops::cuda {

// Runs the forward described by `a` (tensor-core kernel where it applies, else the row kernel), with
// `a.splits` key splits merged by their lse. The caller sets a.partial_* when a.splits > 1.
template <typename T>
void launch_attention_forward(const ForwardArgs<T>& a);

// Runs the backward described by `a` (a.delta: scratch of the lse's shape; a.dq_accum: a zeroed fp32 buffer
// laid out like q when backward_uses_mma(a), else null).
template <typename T>
void launch_attention_backward(const BackwardArgs<T>& a);

// Whether launch_attention_backward runs the tensor-core backward for `a` (its pointers, strides and dims
// set), which needs a.dq_accum.
template <typename T>
bool backward_uses_mma(const BackwardArgs<T>& a);

// The tensor-core forward (forward_mma.cu): whether it covers this case, and its launcher.
bool mma_forward_supported(c10::ScalarType dtype, int64_t dim_qk, int64_t dim_v);
template <typename T>
bool mma_forward_aligned(const ForwardArgs<T>& a);  // pointers and strides suit its 16-byte loads
template <typename T>
void launch_forward_mma(const ForwardArgs<T>& a);
// Whether the tensor-core forward reads V from the K tile (one tensor, one key layout; the head stride
// ignored with one KV head): MLA's latent cache.
bool values_inside_keys(const void* k, const KeyLayout& k_layout, const void* v, const KeyLayout& v_layout,
                        int64_t heads_kv);

// The tensor-core backward (backward_mma.cu): whether it covers this case, and its launcher (after
// backward_delta_kernel; a.dq_accum zeroed).
bool mma_backward_supported(c10::ScalarType dtype, int64_t dim_qk, int64_t dim_v);
template <typename T>
bool mma_backward_aligned(const BackwardArgs<T>& a);  // pointers and strides suit its 16-byte loads
template <typename T>
void launch_backward_mma(const BackwardArgs<T>& a);

}  // namespace attn_ops::cuda
