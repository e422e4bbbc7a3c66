// The attention ops on top of a backend's functions: the shared preparation into an AttentionCall
// (attention/validation.h), the output allocation, then the backend. CPU and CUDA instantiate these templates
// with their own functions, so a backend file holds only its kernels and their launch. Instantiated with nullptr
// (no backend) they are the Meta kernels: the preparation and empty outputs of its SymInt shapes.
#pragma once

#include "attention/validation.h"
#include "common/attention_call.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace attn_ops {

template <AttentionForwardFn forward>
std::tuple<at::Tensor, at::Tensor> attention_on(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                std::optional<double> scale, bool causal, int64_t window_left,
                                                int64_t window_right, double softcap,
                                                const std::optional<at::Tensor>& cu_seqlens_q,
                                                const std::optional<at::Tensor>& cu_seqlens_k,
                                                std::optional<c10::SymInt> max_seqlen_q,
                                                std::optional<c10::SymInt> max_seqlen_k,
                                                const std::optional<at::Tensor>& sinks, int64_t attention_chunk,
                                                const std::optional<at::Tensor>& alibi_slopes,
                                                bool /*deterministic: the backward's, which autograd passes on*/) {
  const AttentionCall call = prepare_attention(q, k, v, scale, causal, window_left, window_right, softcap,
                                               cu_seqlens_q, cu_seqlens_k, size_hint(max_seqlen_q),
                                               size_hint(max_seqlen_k),
                                               PatternOptions{sinks, alibi_slopes, attention_chunk});
  auto [out, lse] = empty_out_lse(call.outputs, q.options());
  if constexpr (forward != nullptr) {
    forward(call, out, lse);
  }
  return {out, lse};
}

template <AttentionBackwardFn backward>
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_on(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& dlse, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, std::optional<c10::SymInt> max_seqlen_q,
    std::optional<c10::SymInt> max_seqlen_k, int64_t attention_chunk, const std::optional<at::Tensor>& alibi_slopes,
    bool deterministic) {
  const AttentionBackwardCall call = prepare_attention_backward(
      dout, q, k, v, out, lse, dlse, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k,
      size_hint(max_seqlen_q), size_hint(max_seqlen_k), PatternOptions{std::nullopt, alibi_slopes, attention_chunk},
      deterministic);
  auto [dq, dk, dv] = empty_attention_grads(q, k, v);
  if constexpr (backward != nullptr) {
    backward(call, dq, dk, dv);
  }
  return {dq, dk, dv};
}

template <AttentionForwardFn forward>
std::tuple<at::Tensor, at::Tensor> attention_with_kvcache_on(const at::Tensor& q, const at::Tensor& k_cache,
                                                             const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                             const std::optional<at::Tensor>& block_table,
                                                             std::optional<double> scale, bool causal,
                                                             int64_t window_left, int64_t window_right,
                                                             double softcap,
                                                             const std::optional<at::Tensor>& cu_seqlens_q,
                                                             std::optional<c10::SymInt> max_seqlen_q,
                                                             const std::optional<at::Tensor>& cache_batch_idx,
                                                             const std::optional<at::Tensor>& cache_leftpad,
                                                             const std::optional<at::Tensor>& sinks,
                                                             int64_t attention_chunk,
                                                             const std::optional<at::Tensor>& alibi_slopes,
                                                             int64_t num_splits,
                                                             const std::optional<at::Tensor>& k_scale,
                                                             const std::optional<at::Tensor>& v_scale) {
  const KvCacheRows rows{cu_seqlens_q, size_hint(max_seqlen_q), cache_batch_idx, cache_leftpad};
  const AttentionCall call = prepare_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, scale,
                                                            causal, window_left, window_right, softcap, rows,
                                                            PatternOptions{sinks, alibi_slopes, attention_chunk},
                                                            num_splits, CacheScales{k_scale, v_scale});
  auto [out, lse] = empty_out_lse(call.outputs, q.options());
  if constexpr (forward != nullptr) {
    forward(call, out, lse);
  }
  return {out, lse};
}

}  // namespace attn_ops
