// Host entry points of the CUDA attention kernels, shared by the attention ops (attention_cuda.cu) and the
// MLA ops (mla/cuda). Every launcher runs on the current stream and synchronises nothing.
#pragma once

#include "attention/cuda/problem.cuh"
#include "common/serving.h"
#include "common/cuda/index_checks.h"

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <tuple>

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

// Attention of q [B, Tq, Hq, D] over the keys cache_leftpad[b] (else 0) .. cache_seqlens[b] - 1 of cache
// row cache_batch_idx[b] (else b) of a contiguous cache [rows, capacity, Hkv, D] or, with block_table, of a
// paged one [num_blocks, block_size, Hkv, D] through block-table row cache_batch_idx[b] (else b); arguments
// already validated (k_cache and v_cache may be views of one tensor: MLA's latent cache); writes out and lse.
void kvcache_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& block_table, double scale,
                       bool causal, int64_t window_left, int64_t window_right, double softcap, const KvCacheRows& rows,
                       const at::Tensor& out, const at::Tensor& lse);

// On the device, in the host validation's order: cache_batch_idx in [0, rows of the block table or of the
// cache, named cache_name), cache_leftpad in [0, cache_seqlens[b]], cache_seqlens in [0, capacity] and,
// paged, the block-table entries of the used blocks in [0, num_blocks).
void check_kvcache_values_on_device(const char* op, const char* cache_name, const at::Tensor& k_cache,
                                    const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& block_table,
                                    const KvCacheRows& rows);

// kvcache_attention after the device-side checks of the index tensors, named for op `Op` whose cache
// argument is `CacheName`: the CUDA backend function of attention_with_kvcache_on and mla_decode_on (whose
// validation reads no values of CUDA tensors).
template <const char* Op, const char* CacheName>
void checked_kvcache_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                               const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& block_table,
                               double scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
                               const KvCacheRows& rows, const at::Tensor& out, const at::Tensor& lse) {
  // Before the first check kernel: it must run on q's device and see that device's capture state.
  const c10::cuda::CUDAGuard device_guard(q.device());
  if (rows.packed()) {  // packed queries: [total_q, heads, dim]
    check_cu_seqlens_on_device(Op, "cu_seqlens_q", *rows.cu_seqlens_q, q.size(0), "q",
                               rows.max_seqlen_q.value_or(-1), "max_seqlen_q");
  }
  check_kvcache_values_on_device(Op, CacheName, k_cache, cache_seqlens, block_table, rows);
  kvcache_attention(q, k_cache, v_cache, cache_seqlens, block_table, scale, causal, window_left, window_right,
                    softcap, rows, out, lse);
}

}  // namespace attn_ops::cuda
