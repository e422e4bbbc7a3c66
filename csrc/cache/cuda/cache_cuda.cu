// CUDA kernels of the KV-cache writes: the shared validation and the device-side value checks (before any
// write), then row copies.
#include "common/cuda/copy_rows.cuh"
#include "cache/validation.h"
#include "common/cuda/index_checks.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace attn_ops::cuda {
namespace {

// superseded[t] for token t = b * added + i of an append into cache rows cache_row[b] at positions
// cache_len[b] + i: whether a higher batch row o > b with cache_row[o] == cache_row[b] writes that position.
// Repeated cache_batch_idx rows then resolve deterministically (the highest batch row's token lands) instead of
// racing. One thread per token, a scan of the batch rows after it.
__global__ void mark_superseded_tokens_kernel(const int32_t* cache_row, const int32_t* cache_len, int64_t batch,
                                              int64_t added, bool* superseded) {
  const int64_t total = batch * added;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = t / added;
    const int64_t pos = static_cast<int64_t>(cache_len[b]) + t % added;
    bool covered = false;
    for (int64_t o = b + 1; o < batch && !covered; ++o) {
      covered = cache_row[o] == cache_row[b] && pos >= cache_len[o] && pos < static_cast<int64_t>(cache_len[o]) + added;
    }
    superseded[t] = covered;
  }
}

void kv_cache_append_cuda(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& cache_seqlens,
                          const std::optional<at::Tensor>& cache_batch_idx,
                          const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  const char* op = "attn_ops.kv_cache_append";
  check_kv_cache_append_inputs(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, CacheScales{k_scale, v_scale});
  check_backend_reads_cache(op, {"k_cache", k_cache}, "CUDA");
  const c10::cuda::CUDAGuard guard(k_cache.device());
  // Batch row b writes cache row cache_batch_idx[b]. Rows may repeat: where two batch rows write one position,
  // only the higher batch row's token is copied (marked before the copy), so no two writers race.
  const at::Tensor rows = cache_batch_idx.has_value() ? cache_batch_idx->contiguous() : at::Tensor();
  if (rows.defined()) {
    check_batch_idx_on_device(op, rows, k_cache.size(0), "k_cache", /*distinct=*/false);
  }
  check_append_lengths_on_device(op, cache_seqlens, k.size(1), k_cache.size(1));
  const at::Tensor lens = cache_seqlens.contiguous();
  at::Tensor superseded;
  if (rows.defined() && k.size(0) > 1 && k.size(1) > 0) {
    const int64_t tokens = k.size(0) * k.size(1);
    superseded = at::empty({tokens}, k_cache.options().dtype(at::kBool));
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>(ceil_div(tokens, threads), 8 * int64_t(sm_count()));
    mark_superseded_tokens_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        rows.const_data_ptr<int32_t>(), lens.const_data_ptr<int32_t>(), k.size(0), k.size(1),
        superseded.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
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
                                cache.size(0),
                                superseded.defined() ? superseded.const_data_ptr<bool>() : nullptr};
    const bool wide = wide_rows(cache.data_ptr(), src.const_data_ptr(), src.size(-1), src.element_size(),
                                {cache.stride(0), cache.stride(1), cache.stride(2), src.stride(0), src.stride(1),
                                 src.stride(2)});
    launch_copy_rows(cache.data_ptr(), src.const_data_ptr(), src.size(0) * src.size(1), src.size(2), src.size(3),
                     src.element_size(), wide, offsets);
  }
}

void paged_kv_cache_append_cuda(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& slot_mapping,
                                const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  const char* op = "attn_ops.paged_kv_cache_append";
  check_paged_kv_cache_append_inputs(k_cache, v_cache, k, v, slot_mapping, CacheScales{k_scale, v_scale});
  check_backend_reads_cache(op, {"k_cache", k_cache}, "CUDA");
  const c10::cuda::CUDAGuard guard(k_cache.device());
  check_slot_values_on_device(op, slot_mapping, k_cache.size(0), k_cache.size(1));
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
