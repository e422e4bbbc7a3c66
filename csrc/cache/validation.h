// Argument checks of the KV-cache write ops, shared by every backend (CPU, CUDA, Meta). Everything is
// checked before anything is written: a rejected append leaves the cache untouched.
#pragma once

#include "common/cache_dtype.h"

#include <ATen/core/Tensor.h>

#include <optional>

namespace attn_ops {

// kv_cache_append: k_cache [B, capacity, Hkv, Dk], v_cache [B, capacity, Hkv, Dv], k [B, Tnew, Hkv, Dk],
// v [B, Tnew, Hkv, Dv], cache_seqlens int32 [B] (its values are checked when the tensors hold data). With
// cache_batch_idx (int32 [B]), the caches have any number of rows and row b of k goes to cache row
// cache_batch_idx[b]; rows may repeat (where two batch rows write one position, the higher batch row's token lands).
// The caches have k's dtype, or are 8-bit (float8_e4m3fn / float8_e5m2) with optional scales (check_cache_scale).
void check_kv_cache_append_inputs(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& cache_seqlens,
                                  const std::optional<at::Tensor>& cache_batch_idx, const CacheScales& scales);

// paged_kv_cache_append: k_cache [num_blocks, block_size, Hkv, Dk], v_cache [.., Dv], k [N, Hkv, Dk],
// v [N, Hkv, Dv], slot_mapping int32/int64 [N] with values in [-1, num_blocks * block_size).
// Dtypes and scales as kv_cache_append's.
void check_paged_kv_cache_append_inputs(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& slot_mapping,
                                        const CacheScales& scales);

}  // namespace attn_ops
