// Argument checks of the MLA ops (mla_cache_append, mla_decode), shared by every backend (CPU, CUDA, Meta).
#pragma once

#include "common/attention_call.h"
#include "common/serving.h"

#include <ATen/core/Tensor.h>

#include <optional>

namespace attn_ops {

// latent_cache [B, capacity, d_c + d_rope] with cache_seqlens, or [num_blocks, block_size, d_c + d_rope]
// with slot_mapping; c_kv [B, Tnew, d_c] / [N, d_c]; k_pe [B, Tnew, d_rope] / [N, d_rope]. cache_batch_idx
// (contiguous only; int32 [B], distinct): row b goes to cache row cache_batch_idx[b] of a cache of any rows.
// latent_cache has c_kv's dtype, or is 8-bit with an optional kv_scale ([] or [1]; common/cache_dtype.h).
void check_mla_cache_append_inputs(const at::Tensor& latent_cache, const at::Tensor& c_kv, const at::Tensor& k_pe,
                                   const std::optional<at::Tensor>& cache_seqlens,
                                   const std::optional<at::Tensor>& slot_mapping,
                                   const std::optional<at::Tensor>& cache_batch_idx,
                                   const std::optional<at::Tensor>& kv_scale = std::nullopt);

// q_latent [B, Tq, H, d_c], q_rope [B, Tq, H, d_rope] (packed [total_q, H, *] with rows.cu_seqlens_q) over
// latent_cache [B, capacity, d_c + d_rope] or, with block_table [B, max_blocks_per_seq],
// [num_blocks, block_size, d_c + d_rope] (any number of cache / block-table rows with cache_batch_idx).
// Returns the call of the attention kernels it runs on: MQA with one key head of width d_c + d_rope whose first
// d_c features are also the value, i.e. q = [q_latent, q_rope] over two views of the one latent cache (all heads
// of a row share each cache tile); out_latent as q_latent, lse [B, H, Tq] (packed: [H, total_q]).
AttentionCall prepare_mla_decode(const at::Tensor& q_latent, const at::Tensor& q_rope, const at::Tensor& latent_cache,
                                 const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& block_table,
                                 double scale, bool causal, const KvCacheRows& rows,
                                 const std::optional<at::Tensor>& kv_scale = std::nullopt);

}  // namespace attn_ops
