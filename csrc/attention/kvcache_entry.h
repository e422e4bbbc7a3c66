// The attention_with_kvcache op on top of a backend's attention-over-a-cache function: the shared
// validation, the default scale, then the backend (CPU and CUDA instantiate it with their own function).
#pragma once

#include "attention/validation.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <optional>
#include <tuple>

namespace attn_ops {

// A backend's attention of q [B, Tq, Hq, D] over a contiguous or paged cache, arguments already validated:
// (q, k_cache, v_cache, cache_seqlens, block_table, scale, causal, window_left, window_right, softcap, rows).
using KvCacheAttentionFn = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, const at::Tensor&,
                                                                  const std::optional<at::Tensor>&, double, bool,
                                                                  int64_t, int64_t, double, const KvCacheRows&);

template <KvCacheAttentionFn kvcache_attention>
std::tuple<at::Tensor, at::Tensor> attention_with_kvcache_on(const at::Tensor& q, const at::Tensor& k_cache,
                                                             const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                             const std::optional<at::Tensor>& block_table,
                                                             std::optional<double> scale, bool causal,
                                                             int64_t window_left, int64_t window_right,
                                                             double softcap,
                                                             const std::optional<at::Tensor>& cu_seqlens_q,
                                                             std::optional<int64_t> max_seqlen_q,
                                                             const std::optional<at::Tensor>& cache_batch_idx,
                                                             const std::optional<at::Tensor>& cache_leftpad) {
  const KvCacheRows rows{cu_seqlens_q, max_seqlen_q, cache_batch_idx, cache_leftpad};
  check_attention_with_kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table, scale, window_left, window_right,
                                      softcap, rows);
  return kvcache_attention(q, k_cache, v_cache, cache_seqlens, block_table,
                           scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1)))), causal, window_left,
                           window_right, softcap, rows);
}

}  // namespace attn_ops
