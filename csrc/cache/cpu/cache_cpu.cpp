// CPU kernels of the KV-cache writes: row copies (quantized into 8-bit caches: common/cpu/copy_rows.h).
#include "common/cpu/copy_rows.h"
#include "cache/validation.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace attn_ops::cpu {
namespace {

// A cache, the new rows it takes and their scale (8-bit caches).
using Write = std::tuple<const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&>;

void kv_cache_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& cache_seqlens,
                         const std::optional<at::Tensor>& cache_batch_idx,
                         const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  check_kv_cache_append_inputs(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, CacheScales{k_scale, v_scale});
  const at::Tensor lens = cache_seqlens.contiguous();
  const int32_t* len = lens.const_data_ptr<int32_t>();
  const int64_t batch = k.size(0), added = k.size(1), heads = k.size(2);
  const std::vector<int64_t> cache_row = batch_rows(cache_batch_idx, batch);
  const std::vector<char> skip =
      cache_batch_idx.has_value() ? superseded_tokens(cache_row, len, added) : std::vector<char>();
  // Token t of the flattened [batch, seqlen_new] new tokens goes to position len[b] + t % seqlen_new of cache
  // row cache_row[b], unless a higher batch row writes that position too (repeated cache_batch_idx rows).
  for (const auto& [cache, src, scale] : {Write{k_cache, k, k_scale}, {v_cache, v, v_scale}}) {
    copy_rows(
        cache, src, batch * added, heads,
        [&](int64_t t, int64_t h) -> int64_t {
          if (!skip.empty() && skip[t]) {
            return -1;
          }
          const int64_t b = t / added;
          return cache_row[b] * cache.stride(0) + (len[b] + t % added) * cache.stride(1) + h * cache.stride(2);
        },
        [&](int64_t t, int64_t h) { return (t / added) * src.stride(0) + (t % added) * src.stride(1) + h * src.stride(2); },
        scale);
  }
}

void paged_kv_cache_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& slot_mapping,
                               const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  check_paged_kv_cache_append_inputs(k_cache, v_cache, k, v, slot_mapping, CacheScales{k_scale, v_scale});
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t* slot = slots.const_data_ptr<int64_t>();
  const int64_t block_size = k_cache.size(1);
  for (const auto& [cache, src, scale] : {Write{k_cache, k, k_scale}, {v_cache, v, v_scale}}) {
    copy_rows(
        cache, src, k.size(0), k.size(1),
        [&](int64_t t, int64_t h) -> int64_t {
          if (slot[t] < 0) {
            return -1;  // skipped token
          }
          return (slot[t] / block_size) * cache.stride(0) + (slot[t] % block_size) * cache.stride(1) +
                 h * cache.stride(2);
        },
        [&](int64_t t, int64_t h) { return t * src.stride(0) + h * src.stride(1); }, scale);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("kv_cache_append", &kv_cache_append_cpu);
  m.impl("paged_kv_cache_append", &paged_kv_cache_append_cpu);
}

}  // namespace attn_ops::cpu
