// The test hook _cudnn_validate_attention (schema in registration.cpp): the call its tensors describe, prepared by
// the op's own preparation, converted as the CUDA backend converts it (cudnn_problem.h) and validated by cuDNN for
// a compute capability. Registered for every dispatch key (CompositeExplicitAutograd), so meta tensors describe
// the call and no GPU is needed.
#ifdef ATTN_OPS_WITH_CUDNN

#include "attention/cuda/cudnn_graph.h"
#include "attention/cuda/cudnn_problem.h"
#include "attention/validation.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace attn_ops::cuda {
namespace {

std::string validate_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                               int64_t window_left, int64_t window_right, bool backward,
                               const std::optional<at::Tensor>& cache_seqlens,
                               const std::optional<at::Tensor>& block_table, int64_t sm) {
  if (cache_seqlens.has_value()) {
    TORCH_CHECK(!backward, "_cudnn_validate_attention: a call over a cache has no backward");
    const AttentionCall call = prepare_attention_with_kvcache(q, k, v, *cache_seqlens, block_table, std::nullopt,
                                                              causal, window_left, window_right, 0.0, KvCacheRows{},
                                                              PatternOptions{});
    auto [out, lse] = empty_out_lse(call.outputs, q.options());
    return validate_sdpa(sdpa_forward_problem(call, out, lse), static_cast<int>(sm));
  }
  const AttentionCall call = prepare_attention(q, k, v, std::nullopt, causal, window_left, window_right, 0.0,
                                               std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                               PatternOptions{});
  auto [out, lse] = empty_out_lse(call.outputs, q.options());
  if (!backward) {
    return validate_sdpa(sdpa_forward_problem(call, out, lse), static_cast<int>(sm));
  }
  const AttentionBackwardCall grad =
      prepare_attention_backward(at::empty_like(out), q, k, v, out, lse, std::nullopt, std::nullopt, causal,
                                 window_left, window_right, 0.0, std::nullopt, std::nullopt, std::nullopt,
                                 std::nullopt, PatternOptions{});
  auto [dq, dk, dv] = empty_attention_grads(q, k, v);
  return validate_sdpa(sdpa_backward_problem(grad, dq, dk, dv), static_cast<int>(sm));
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CompositeExplicitAutograd, m) {
  m.impl("_cudnn_validate_attention", &validate_attention);
}

}  // namespace attn_ops::cuda

#endif  // ATTN_OPS_WITH_CUDNN
