// CPU kernels of the KV-cache writes: row copies (a copy is exact in every dtype, so no dtype dispatch).
#include "cache/validation.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

namespace attn_ops::cpu {
namespace {

// Copies the `dim` elements of one head row.
inline void copy_row(char* dst, const char* src, int64_t dim, int64_t elem_size) {
  std::memcpy(dst, src, dim * elem_size);
}

// dst[dst_offset(t, h)] = src[src_offset(t, h)] for t < tokens, h < heads; offsets in elements.
template <typename DstOffset, typename SrcOffset>
void copy_rows(const at::Tensor& dst, const at::Tensor& src, int64_t tokens, int64_t heads, const DstOffset& dst_offset,
               const SrcOffset& src_offset) {
  const int64_t dim = src.size(-1), elem = src.element_size();
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.const_data_ptr());
  at::parallel_for(0, tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, heads * dim)), [&](int64_t begin,
                                                                                                   int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t to = dst_offset(t, h);
        if (to >= 0) {
          copy_row(d + to * elem, s + src_offset(t, h) * elem, dim, elem);
        }
      }
    }
  });
}

void kv_cache_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& cache_seqlens) {
  check_kv_cache_append_inputs(k_cache, v_cache, k, v, cache_seqlens);
  const at::Tensor lens = cache_seqlens.contiguous();
  const int32_t* len = lens.const_data_ptr<int32_t>();
  const int64_t batch = k.size(0), added = k.size(1), heads = k.size(2);
  // Token t of the flattened [batch, seqlen_new] new tokens goes to row len[b] + t % seqlen_new of batch b.
  for (const auto& [cache, src] : {std::pair<const at::Tensor&, const at::Tensor&>{k_cache, k}, {v_cache, v}}) {
    copy_rows(
        cache, src, batch * added, heads,
        [&](int64_t t, int64_t h) {
          const int64_t b = t / added;
          return b * cache.stride(0) + (len[b] + t % added) * cache.stride(1) + h * cache.stride(2);
        },
        [&](int64_t t, int64_t h) { return (t / added) * src.stride(0) + (t % added) * src.stride(1) + h * src.stride(2); });
  }
}

void paged_kv_cache_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& slot_mapping) {
  check_paged_kv_cache_append_inputs(k_cache, v_cache, k, v, slot_mapping);
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t* slot = slots.const_data_ptr<int64_t>();
  const int64_t block_size = k_cache.size(1);
  for (const auto& [cache, src] : {std::pair<const at::Tensor&, const at::Tensor&>{k_cache, k}, {v_cache, v}}) {
    copy_rows(
        cache, src, k.size(0), k.size(1),
        [&](int64_t t, int64_t h) -> int64_t {
          if (slot[t] < 0) {
            return -1;  // skipped token
          }
          return (slot[t] / block_size) * cache.stride(0) + (slot[t] % block_size) * cache.stride(1) +
                 h * cache.stride(2);
        },
        [&](int64_t t, int64_t h) { return t * src.stride(0) + h * src.stride(1); });
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("kv_cache_append", &kv_cache_append_cpu);
  m.impl("paged_kv_cache_append", &paged_kv_cache_append_cpu);
}

}  // namespace attn_ops::cpu
