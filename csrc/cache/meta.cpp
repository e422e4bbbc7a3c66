// Meta kernels of the KV-cache writes: the shared checks only (the ops return nothing).
#include "cache/validation.h"

#include <torch/library.h>

namespace attn_ops {
namespace {

void kv_cache_append_meta(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& cache_seqlens,
                          const std::optional<at::Tensor>& cache_batch_idx,
                          const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  check_kv_cache_append_inputs(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, CacheScales{k_scale, v_scale});
}

void paged_kv_cache_append_meta(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& slot_mapping,
                                const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  check_paged_kv_cache_append_inputs(k_cache, v_cache, k, v, slot_mapping, CacheScales{k_scale, v_scale});
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("kv_cache_append", &kv_cache_append_meta);
  m.impl("paged_kv_cache_append", &paged_kv_cache_append_meta);
}

}  // namespace attn_ops
