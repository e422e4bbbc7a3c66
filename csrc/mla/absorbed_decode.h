// The absorbed MLA decode on top of a backend's attention-over-a-cache function. It is MQA with one key
// head of width d_c + d_rope whose first d_c features are also the value, so it runs on two views of the
// one latent cache (all heads of a row share each cache tile). CPU and CUDA instantiate it; with nullptr (no
// backend) it is the Meta kernel.
#pragma once

#include "attention/entry.h"
#include "mla/validation.h"

#include <ATen/ATen.h>

namespace attn_ops {

template <KvCacheAttentionFn kvcache_attention>
std::tuple<at::Tensor, at::Tensor> mla_decode_on(const at::Tensor& q_latent, const at::Tensor& q_rope,
                                                 const at::Tensor& latent_cache, const at::Tensor& cache_seqlens,
                                                 double scale, const std::optional<at::Tensor>& block_table,
                                                 bool causal, const std::optional<at::Tensor>& cu_seqlens_q,
                                                 std::optional<c10::SymInt> max_seqlen_q,
                                                 const std::optional<at::Tensor>& cache_batch_idx,
                                                 const std::optional<at::Tensor>& cache_leftpad) {
  const KvCacheRows rows{cu_seqlens_q, size_hint(max_seqlen_q), cache_batch_idx, cache_leftpad};
  const OutLseSizes outputs =
      prepare_mla_decode(q_latent, q_rope, latent_cache, cache_seqlens, block_table, scale, rows);
  auto [out, lse] = empty_out_lse(outputs, q_latent.options());
  if constexpr (kvcache_attention != nullptr) {
    const int64_t d_c = q_latent.size(-1);
    // q [B, Tq, H, d_c + d_rope] (or packed [total_q, H, ..]); keys: the whole cache row; values: its first d_c
    // features; one KV head.
    const at::Tensor q = at::cat({q_latent, q_rope}, -1);
    const at::Tensor keys = latent_cache.unsqueeze(-2);
    const at::Tensor values = latent_cache.narrow(-1, 0, d_c).unsqueeze(-2);
    kvcache_attention(q, keys, values, cache_seqlens, block_table, scale, causal, /*window_left=*/-1,
                      /*window_right=*/-1, /*softcap=*/0.0, rows, out, lse);
  }
  return {out, lse};
}

}  // namespace attn_ops
