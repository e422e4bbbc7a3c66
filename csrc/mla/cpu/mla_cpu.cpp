// CPU kernels of the MLA ops: the cache write as two row copies (quantized into an 8-bit cache), and the absorbed decode
// (mla/absorbed_decode.h) on the CPU attention forward.
#include "mla/absorbed_decode.h"
#include "mla/validation.h"

#include "common/attention_call.h"
#include "common/cpu/copy_rows.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>
#include <vector>

namespace attn_ops::cpu {
namespace {

void mla_cache_append_cpu(const at::Tensor& latent_cache, const at::Tensor& c_kv, const at::Tensor& k_pe,
                          const std::optional<at::Tensor>& cache_seqlens,
                          const std::optional<at::Tensor>& slot_mapping,
                          const std::optional<at::Tensor>& cache_batch_idx,
                          const std::optional<at::Tensor>& kv_scale) {
  check_mla_cache_append_inputs(latent_cache, c_kv, k_pe, cache_seqlens, slot_mapping, cache_batch_idx, kv_scale);
  const int64_t d_c = c_kv.size(-1);
  // New token t: the offset of its cache row (-1: skipped) and its index in the leading dims of c_kv / k_pe.
  std::vector<int64_t> cache_row;
  std::vector<std::array<int64_t, 2>> token_index;
  if (slot_mapping.has_value()) {
    const at::Tensor slots = slot_mapping->to(at::kLong).contiguous();
    const int64_t* slot = slots.const_data_ptr<int64_t>();
    const int64_t block_size = latent_cache.size(1);
    for (int64_t t = 0; t < c_kv.size(0); ++t) {
      cache_row.push_back(slot[t] < 0 ? -1
                                      : (slot[t] / block_size) * latent_cache.stride(0) +
                                            (slot[t] % block_size) * latent_cache.stride(1));
      token_index.push_back({t, 0});
    }
  } else {
    const at::Tensor lens = cache_seqlens->contiguous();
    const int32_t* len = lens.const_data_ptr<int32_t>();
    const std::vector<int64_t> rows = batch_rows(cache_batch_idx, c_kv.size(0));
    for (int64_t b = 0; b < c_kv.size(0); ++b) {
      for (int64_t i = 0; i < c_kv.size(1); ++i) {
        cache_row.push_back(rows[b] * latent_cache.stride(0) + (len[b] + i) * latent_cache.stride(1));
        token_index.push_back({b, i});
      }
    }
  }
  // latent_cache[row, :d_c] = c_kv, latent_cache[row, d_c:] = k_pe
  for (const auto& [src, column] : {std::pair<const at::Tensor&, int64_t>{c_kv, 0}, {k_pe, d_c}}) {
    // A 2-D (paged) source has index [t, 0]: its second stride is multiplied by 0.
    const int64_t stride0 = src.stride(0), stride1 = src.dim() == 3 ? src.stride(1) : 0;
    copy_rows(
        latent_cache, src, static_cast<int64_t>(cache_row.size()), 1,
        [&](int64_t t, int64_t) { return cache_row[t] < 0 ? -1 : cache_row[t] + column; },
        [&](int64_t t, int64_t) { return token_index[t][0] * stride0 + token_index[t][1] * stride1; }, kv_scale);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("mla_cache_append", &mla_cache_append_cpu);
  m.impl("mla_decode", &mla_decode_on<attention_forward>);
}

}  // namespace attn_ops::cpu
