// Checks of the serving-step arguments (packed queries, cache_batch_idx, cache_leftpad), shared by
// attention_with_kvcache, mla_decode and the cache writes on every backend.
#include "common/serving.h"

#include "common/checks.h"
#include "common/index_checks.h"

#include <ATen/ATen.h>


namespace attn_ops {
namespace {

// A per-row int32 [batch] argument on q's device.
void check_row_vector(const char* op, const char* name, const at::Tensor& t, const c10::SymInt& batch,
                      const char* ref_name, const at::Tensor& ref) {
  check_index_tensor(op, name, t, /*allow_int64=*/false, t.dim() == 1 && t.sym_size(0) == batch,
                     [&] { return shape_str({batch}); });
  check_same_device(op, name, t, ref_name, ref);
}

at::Tensor host_int32(const at::Tensor& t) { return t.to(at::kCPU).contiguous(); }

}  // namespace

c10::SymInt check_kvcache_rows(const char* op, const KvCacheRows& rows, const at::Tensor& q, const char* q_name) {
  c10::SymInt batch = q.dim() >= 1 ? q.sym_size(0) : c10::SymInt(0);
  if (rows.packed()) {
    const at::Tensor& cu = *rows.cu_seqlens_q;
    TORCH_CHECK(cu.scalar_type() == at::kInt && cu.dim() == 1 && cu.sym_size(0) >= 1, op,
                ": cu_seqlens_q must be an int32 tensor of shape [batch + 1], got ", dtype_name(cu.scalar_type()),
                " tensor of shape ", shape_str(cu));
    check_same_device(op, "cu_seqlens_q", cu, q_name, q);
    batch = cu.sym_size(0) - 1;
  }
  TORCH_CHECK(!rows.max_seqlen_q.has_value() || rows.packed(), op,
              ": max_seqlen_q must be given only with cu_seqlens_q");
  TORCH_CHECK(rows.max_seqlen_q.value_or(0) >= 0, op, ": max_seqlen_q must be >= 0, got ", *rows.max_seqlen_q);
  if (rows.cache_batch_idx.has_value()) {
    check_row_vector(op, "cache_batch_idx", *rows.cache_batch_idx, batch, q_name, q);
  }
  if (rows.cache_leftpad.has_value()) {
    check_row_vector(op, "cache_leftpad", *rows.cache_leftpad, batch, q_name, q);
  }
  return batch;
}

void check_kvcache_row_values(const char* op, const KvCacheRows& rows, int64_t total_q, int64_t selectable_rows,
                              const char* rows_name, const at::Tensor& cache_seqlens, const at::Tensor& block_table,
                              int64_t capacity, int64_t block_size, int64_t num_blocks) {
  if (rows.packed()) {
    const int64_t longest = check_cu_seqlens_values(op, "cu_seqlens_q", *rows.cu_seqlens_q, total_q, "q");
    check_max_seqlen(op, "max_seqlen_q", "cu_seqlens_q", rows.max_seqlen_q, longest);
  }
  const at::Tensor idx = rows.cache_batch_idx.has_value() ? host_int32(*rows.cache_batch_idx) : at::Tensor();
  if (idx.defined()) {
    check_batch_idx_values(op, idx, selectable_rows, rows_name, /*distinct=*/false);
  }
  const at::Tensor pad = rows.cache_leftpad.has_value() ? host_int32(*rows.cache_leftpad) : at::Tensor();
  if (pad.defined()) {
    const at::Tensor lens = host_int32(cache_seqlens);
    const int32_t *p = pad.const_data_ptr<int32_t>(), *l = lens.const_data_ptr<int32_t>();
    for (int64_t b = 0; b < pad.numel(); ++b) {
      TORCH_CHECK(p[b] >= 0, op, ": cache_leftpad[", b, "] = ", p[b], " must be >= 0");
      TORCH_CHECK(p[b] <= l[b], op, ": cache_leftpad[", b, "] = ", p[b], " exceeds cache_seqlens[", b, "] = ", l[b],
                  " (the keys of row ", b, " are cache positions cache_leftpad[", b, "] .. cache_seqlens[", b,
                  "] - 1)");
    }
  }
  check_cache_lengths_and_blocks(op, cache_seqlens, block_table, capacity, block_size, num_blocks, idx, pad);
}

void check_write_batch_idx(const char* op, const at::Tensor& cache_batch_idx, const c10::SymInt& batch,
                           const c10::SymInt& cache_rows, const char* ref_name, const at::Tensor& ref, bool distinct) {
  check_row_vector(op, "cache_batch_idx", cache_batch_idx, batch, ref_name, ref);
  if (!can_read_values(cache_batch_idx) || cache_rows.is_symbolic()) {
    return;
  }
  check_batch_idx_values(op, cache_batch_idx, cache_rows.expect_int(), ref_name, distinct);
}

}  // namespace attn_ops
