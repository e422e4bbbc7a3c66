// The absorbed MLA decode on top of a backend's attention forward: the preparation (mla/validation.h) turns it
// into an attention call over two views of the latent cache, which the backend runs as any other. CPU and CUDA
// instantiate it; with nullptr (no backend) it is the Meta kernel.
#pragma once

#include "common/attention_call.h"
#include "mla/validation.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace attn_ops {

template <AttentionForwardFn forward>
std::tuple<at::Tensor, at::Tensor> mla_decode_on(const at::Tensor& q_latent, const at::Tensor& q_rope,
                                                 const at::Tensor& latent_cache, const at::Tensor& cache_seqlens,
                                                 double scale, const std::optional<at::Tensor>& block_table,
                                                 bool causal, const std::optional<at::Tensor>& cu_seqlens_q,
                                                 std::optional<c10::SymInt> max_seqlen_q,
                                                 const std::optional<at::Tensor>& cache_batch_idx,
                                                 const std::optional<at::Tensor>& cache_leftpad,
                                                 const std::optional<at::Tensor>& kv_scale) {
  const KvCacheRows rows{cu_seqlens_q, size_hint(max_seqlen_q), cache_batch_idx, cache_leftpad};
  const AttentionCall call =
      prepare_mla_decode(q_latent, q_rope, latent_cache, cache_seqlens, block_table, scale, causal, rows, kv_scale);
  auto [out, lse] = empty_out_lse(call.outputs, q_latent.options());
  if constexpr (forward != nullptr) {
    forward(call, out, lse);
  }
  return {out, lse};
}

}  // namespace attn_ops
