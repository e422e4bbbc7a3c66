// CUDA kernels of the KV-cache writes: the shared validation and the device-side value checks (before any
// write), then row copies.
#include "cache/cuda/copy_rows.cuh"
#include "cache/validation.h"
#include "common/cuda/index_checks.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace attn_ops::cuda {
namespace {

void kv_cache_append_cuda(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& cache_seqlens,
                          const std::optional<at::Tensor>& cache_batch_idx) {
  const char* op = "attn_ops.kv_cache_append";
  check_kv_cache_append_inputs(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx);
  const c10::cuda::CUDAGuard guard(k_cache.device());
  // Batch row b writes cache row cache_batch_idx[b] (distinct rows: no two writers race).
  const at::Tensor rows = cache_batch_idx.has_value() ? cache_batch_idx->contiguous() : at::Tensor();
  if (rows.defined()) {
    check_batch_idx_on_device(op, rows, k_cache.size(0), "k_cache", /*distinct=*/true);
  }
  check_append_lengths_on_device(op, cache_seqlens, k.size(1), k_cache.size(1));
  const at::Tensor lens = cache_seqlens.contiguous();
  for (const auto& [cache, src] : {std::pair<const at::Tensor&, const at::Tensor&>{k_cache, k}, {v_cache, v}}) {
    const AppendOffsets offsets{lens.const_data_ptr<int32_t>(),
                                src.size(1),
                                cache.size(1),
                                cache.stride(0),
                                cache.stride(1),
                                cache.stride(2),
                                src.stride(0),
                                src.stride(1),
                                src.stride(2),
                                rows.defined() ? rows.const_data_ptr<int32_t>() : nullptr,
                                cache.size(0)};
    const bool wide = wide_rows(cache.data_ptr(), src.const_data_ptr(), src.size(-1), src.element_size(),
                                {cache.stride(0), cache.stride(1), cache.stride(2), src.stride(0), src.stride(1),
                                 src.stride(2)});
    launch_copy_rows(cache.data_ptr(), src.const_data_ptr(), src.size(0) * src.size(1), src.size(2), src.size(3),
                     src.element_size(), wide, offsets);
  }
}

void paged_kv_cache_append_cuda(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& slot_mapping) {
  check_paged_kv_cache_append_inputs(k_cache, v_cache, k, v, slot_mapping);
  const c10::cuda::CUDAGuard guard(k_cache.device());
  check_slot_values_on_device("attn_ops.paged_kv_cache_append", slot_mapping, k_cache.size(0), k_cache.size(1));
  const at::Tensor slots = slot_mapping.contiguous();
  for (const auto& [cache, src] : {std::pair<const at::Tensor&, const at::Tensor&>{k_cache, k}, {v_cache, v}}) {
    const bool wide = wide_rows(cache.data_ptr(), src.const_data_ptr(), src.size(-1), src.element_size(),
                                {cache.stride(0), cache.stride(1), cache.stride(2), src.stride(0), src.stride(1)});
    with_index_data(slots, [&](const auto* index) {
      const SlotOffsets<pointee_t<decltype(index)>> offsets{
          index, cache.size(0) * cache.size(1), cache.size(1), cache.stride(0), cache.stride(1), cache.stride(2),
          src.stride(0), src.stride(1)};
      launch_copy_rows(cache.data_ptr(), src.const_data_ptr(), src.size(0), src.size(1), src.size(2),
                       src.element_size(), wide, offsets);
    });
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("kv_cache_append", &kv_cache_append_cuda);
  m.impl("paged_kv_cache_append", &paged_kv_cache_append_cuda);
}

}  // namespace attn_ops::cuda
