// The serving-step arguments of the ops that read or write a KV cache: packed (ragged) queries, cache row
// selection and left padding. Their checks are shared by every backend (CPU, CUDA, Meta) and by the
// attention, MLA and cache families. Semantics: docs/kvcache_api.md ("Serving batches").
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace attn_ops {

// The optional trailing arguments of attention_with_kvcache and mla_decode.
struct KvCacheRows {
  std::optional<at::Tensor> cu_seqlens_q;     // int32 [B + 1]: q is packed [total_q, heads, dim]
  std::optional<int64_t> max_seqlen_q;        // >= the longest query run in cu_seqlens_q
  std::optional<at::Tensor> cache_batch_idx;  // int32 [B]: the cache row (contiguous) or block-table row (paged)
  std::optional<at::Tensor> cache_leftpad;    // int32 [B]: cache position of row b's first key

  bool packed() const { return cu_seqlens_q.has_value(); }
  bool any() const { return packed() || cache_batch_idx.has_value() || cache_leftpad.has_value(); }
};

// Shape-level checks of `rows` for a read op whose queries `q` (named `q_name`) are packed [total_q, ...]
// when cu_seqlens_q is given; returns the batch size (cu_seqlens_q length - 1, else q's dim 0).
c10::SymInt check_kvcache_rows(const char* op, const KvCacheRows& rows, const at::Tensor& q, const char* q_name);

// Value checks of a read op, on tensors that hold data (not meta / fake): cu_seqlens_q against q's
// token count and max_seqlen_q, cache_batch_idx in [0, selectable_rows) (`rows_name` says what they are
// rows of), 0 <= cache_leftpad[b] <= cache_seqlens[b]; then the lengths and block-table entries through
// check_cache_lengths_and_blocks.
void check_kvcache_row_values(const char* op, const KvCacheRows& rows, int64_t total_q, int64_t selectable_rows,
                              const char* rows_name, const at::Tensor& cache_seqlens, const at::Tensor& block_table,
                              int64_t capacity, int64_t block_size, int64_t num_blocks);

// cache_batch_idx of a cache write: int32 [batch] on the device of `ref`; when its values can be read, each
// in [0, cache_rows) and, when `distinct` (a write whose kernel does not order repeated rows), no two equal.
void check_write_batch_idx(const char* op, const at::Tensor& cache_batch_idx, const c10::SymInt& batch,
                           const c10::SymInt& cache_rows, const char* ref_name, const at::Tensor& ref, bool distinct);

}  // namespace attn_ops
