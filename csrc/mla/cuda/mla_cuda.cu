// CUDA kernels of the MLA ops, built like the CPU ones: the cache write is two row copies into the two
// column ranges of the latent cache, and the absorbed decode (mla/absorbed_decode.h) runs on the CUDA
// attention forward.
#include "mla/absorbed_decode.h"
#include "mla/validation.h"

#include "common/attention_call.h"
#include "common/cuda/copy_rows.cuh"
#include "common/cuda/index_checks.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace attn_ops::cuda {
namespace {

void mla_cache_append_cuda(const at::Tensor& latent_cache, const at::Tensor& c_kv, const at::Tensor& k_pe,
                           const std::optional<at::Tensor>& cache_seqlens,
                           const std::optional<at::Tensor>& slot_mapping,
                           const std::optional<at::Tensor>& cache_batch_idx,
                           const std::optional<at::Tensor>& kv_scale) {
  const char* op = "attn_ops.mla_cache_append";
  check_mla_cache_append_inputs(latent_cache, c_kv, k_pe, cache_seqlens, slot_mapping, cache_batch_idx, kv_scale);
  check_backend_reads_cache(op, {"latent_cache", latent_cache}, "CUDA");
  const c10::cuda::CUDAGuard guard(latent_cache.device());
  // Contiguous cache only (the validation refuses it with slot_mapping): batch row b writes cache row
  // cache_batch_idx[b], distinct rows.
  const at::Tensor rows = cache_batch_idx.has_value() ? cache_batch_idx->contiguous() : at::Tensor();
  if (rows.defined()) {
    check_batch_idx_on_device(op, rows, latent_cache.size(0), "latent_cache", /*distinct=*/true);
  }
  if (slot_mapping.has_value()) {
    check_slot_values_on_device(op, *slot_mapping, latent_cache.size(0), latent_cache.size(1));
  } else {
    check_append_lengths_on_device(op, *cache_seqlens, c_kv.size(1), latent_cache.size(1));
  }
  const int64_t elem = latent_cache.element_size();
  const int64_t cache0 = latent_cache.stride(0), cache1 = latent_cache.stride(1);
  // Where the rows go, read on the device by both copies.
  const at::Tensor slots = slot_mapping.has_value() ? slot_mapping->contiguous() : at::Tensor();
  const at::Tensor lens = slot_mapping.has_value() ? at::Tensor() : cache_seqlens->contiguous();
  // latent_cache[row, :d_c] = c_kv, latent_cache[row, d_c:] = k_pe
  for (const auto& [src, column] : {std::pair<const at::Tensor&, int64_t>{c_kv, 0}, {k_pe, c_kv.size(-1)}}) {
    char* dst = static_cast<char*>(latent_cache.data_ptr()) + column * elem;
    const int64_t src0 = src.stride(0), src1 = src.dim() == 3 ? src.stride(1) : 0;
    const bool wide = wide_rows(dst, src.const_data_ptr(), src.size(-1), elem, {cache0, cache1, src0, src1});
    if (slots.defined()) {
      with_index_data(slots, [&](const auto* index) {
        const SlotOffsets<pointee_t<decltype(index)>> offsets{
            index, latent_cache.size(0) * latent_cache.size(1), latent_cache.size(1), cache0, cache1, 0, src0, 0};
        launch_copy_rows(dst, src.const_data_ptr(), src.size(0), 1, src.size(-1), elem, wide, offsets);
      });
    } else {
      const AppendOffsets offsets{lens.const_data_ptr<int32_t>(),
                                  src.size(1),
                                  latent_cache.size(1),
                                  cache0,
                                  cache1,
                                  0,
                                  src0,
                                  src1,
                                  0,
                                  rows.defined() ? rows.const_data_ptr<int32_t>() : nullptr,
                                  latent_cache.size(0)};
      launch_copy_rows(dst, src.const_data_ptr(), src.size(0) * src.size(1), 1, src.size(-1), elem, wide, offsets);
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("mla_cache_append", &mla_cache_append_cuda);
  m.impl("mla_decode", &mla_decode_on<attention_forward>);
}

}  // namespace attn_ops::cuda
