// Argument checks of kv_cache_append / paged_kv_cache_append, shared by every backend.
#include "cache/validation.h"

#include "common/cache_dtype.h"
#include "common/checks.h"
#include "common/index_checks.h"
#include "common/serving.h"

#include <ATen/ATen.h>

namespace attn_ops {
namespace {

// dtype, device and last-dim stride of a cache write's four tensors, and the scales of an 8-bit cache.
void check_cache_tensors(const char* op, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                         const at::Tensor& v, const CacheScales& scales) {
  check_cache_dtype(op, {"k_cache", k_cache});
  check_one_device(op, {{"k_cache", k_cache}, {"v_cache", v_cache}, {"k", k}, {"v", v}});
  check_same_dtype_device(op, "v_cache", v_cache, "k_cache", k_cache);
  check_cache_write_dtypes(op, {"k_cache", k_cache}, {{"k", k}, {"v", v}});
  check_cache_scale(op, "k_scale", scales.k, k_cache.sym_size(2), {"k_cache", k_cache});
  check_cache_scale(op, "v_scale", scales.v, v_cache.sym_size(2), {"v_cache", v_cache});
  check_last_dim_contiguous(op, "k_cache", k_cache);
  check_last_dim_contiguous(op, "v_cache", v_cache);
  check_last_dim_contiguous(op, "k", k);
  check_last_dim_contiguous(op, "v", v);
}

// k_cache and v_cache are written: neither may overlap itself or any other argument.
// `rows` is the second index argument (cache_batch_idx), or `index` again when there is none.
void check_cache_targets(const char* op, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                         const at::Tensor& v, const NamedTensor& index, const NamedTensor& rows) {
  check_in_place_target(op, {"k_cache", k_cache}, {{"v_cache", v_cache}, {"k", k}, {"v", v}, index, rows});
  check_in_place_target(op, {"v_cache", v_cache}, {{"k", k}, {"v", v}, index, rows});
}

}  // namespace



void check_kv_cache_append_inputs(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& cache_seqlens,
                                  const std::optional<at::Tensor>& cache_batch_idx, const CacheScales& scales) {
  const char* op = "attn_ops.kv_cache_append";
  check_rank(op, "k_cache", k_cache, 4, "[batch, capacity, heads_kv, head_dim]");
  check_rank(op, "v_cache", v_cache, 4, "[batch, capacity, heads_kv, head_dim_v]");
  check_rank(op, "k", k, 4, "[batch, seqlen_new, heads_kv, head_dim]");
  check_rank(op, "v", v, 4, "[batch, seqlen_new, heads_kv, head_dim_v]");
  check_cache_tensors(op, k_cache, v_cache, k, v, scales);
  const auto& kc = k_cache.sym_sizes();
  TORCH_CHECK(v_cache.sym_size(0) == kc[0] && v_cache.sym_size(1) == kc[1] && v_cache.sym_size(2) == kc[2], op,
              ": v_cache must have shape [", kc[0], ", ", kc[1], ", ", kc[2],
              ", *] (batch, capacity, heads_kv of k_cache), got ", shape_str(v_cache));
  // With cache_batch_idx, the batch is k's and the cache holds any number of rows.
  const bool selected = cache_batch_idx.has_value();
  const c10::SymInt batch = selected ? k.sym_size(0) : kc[0];
  TORCH_CHECK(k.sym_size(0) == batch && k.sym_size(2) == kc[2] && k.sym_size(3) == kc[3], op,
              ": k must have shape [", selected ? std::string("*") : c10::str(kc[0]), ", *, ", kc[2], ", ", kc[3],
              "] (", selected ? "" : "batch, ", "heads_kv, head_dim of k_cache), got ", shape_str(k));
  TORCH_CHECK(v.sym_size(0) == k.sym_size(0) && v.sym_size(1) == k.sym_size(1) && v.sym_size(2) == k.sym_size(2) &&
                  v.sym_size(3) == v_cache.sym_size(3),
              op, ": v must have shape [", k.sym_size(0), ", ", k.sym_size(1), ", ", k.sym_size(2), ", ",
              v_cache.sym_size(3), "] (batch, seqlen_new, heads_kv of k and head_dim_v of v_cache), got ",
              shape_str(v));
  check_index_tensor(op, "cache_seqlens", cache_seqlens, /*allow_int64=*/false,
                     cache_seqlens.dim() == 1 && cache_seqlens.sym_size(0) == batch,
                     [&] { return shape_str({batch}); });
  check_same_device(op, "cache_seqlens", cache_seqlens, "k_cache", k_cache);
  if (selected) {
    // repeated rows allowed: where their writes overlap, the highest batch row's token lands (kv_cache_append)
    check_write_batch_idx(op, *cache_batch_idx, batch, kc[0], "k_cache", k_cache, /*distinct=*/false);
  }
  if (can_read_values(cache_seqlens)) {
    check_append_lengths(op, cache_seqlens, k.size(1), k_cache.size(1));
  }
  const at::Tensor& index = selected ? *cache_batch_idx : cache_seqlens;
  check_cache_targets(op, k_cache, v_cache, k, v, {"cache_seqlens", cache_seqlens},
                      {selected ? "cache_batch_idx" : "cache_seqlens", index});
}

void check_paged_kv_cache_append_inputs(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& slot_mapping,
                                        const CacheScales& scales) {
  const char* op = "attn_ops.paged_kv_cache_append";
  check_rank(op, "k_cache", k_cache, 4, "[num_blocks, block_size, heads_kv, head_dim]");
  check_rank(op, "v_cache", v_cache, 4, "[num_blocks, block_size, heads_kv, head_dim_v]");
  check_rank(op, "k", k, 3, "[num_tokens, heads_kv, head_dim]");
  check_rank(op, "v", v, 3, "[num_tokens, heads_kv, head_dim_v]");
  check_cache_tensors(op, k_cache, v_cache, k, v, scales);
  const auto& kc = k_cache.sym_sizes();
  TORCH_CHECK(v_cache.sym_size(0) == kc[0] && v_cache.sym_size(1) == kc[1] && v_cache.sym_size(2) == kc[2], op,
              ": v_cache must have shape [", kc[0], ", ", kc[1], ", ", kc[2],
              ", *] (num_blocks, block_size, heads_kv of k_cache), got ", shape_str(v_cache));
  TORCH_CHECK(k.sym_size(1) == kc[2] && k.sym_size(2) == kc[3], op, ": k must have shape [*, ", kc[2], ", ", kc[3],
              "] (heads_kv, head_dim of k_cache), got ", shape_str(k));
  TORCH_CHECK(v.sym_size(0) == k.sym_size(0) && v.sym_size(1) == k.sym_size(1) && v.sym_size(2) == v_cache.sym_size(3),
              op, ": v must have shape [", k.sym_size(0), ", ", k.sym_size(1), ", ", v_cache.sym_size(3),
              "] (num_tokens, heads_kv of k and head_dim_v of v_cache), got ", shape_str(v));
  check_index_tensor(op, "slot_mapping", slot_mapping, /*allow_int64=*/true,
                     slot_mapping.dim() == 1 && slot_mapping.sym_size(0) == k.sym_size(0),
                     [&] { return shape_str({k.sym_size(0)}); });
  check_same_device(op, "slot_mapping", slot_mapping, "k_cache", k_cache);
  if (can_read_values(slot_mapping)) {
    check_slot_values(op, slot_mapping, k_cache.size(0), k_cache.size(1));
  }
  check_cache_targets(op, k_cache, v_cache, k, v, {"slot_mapping", slot_mapping}, {"slot_mapping", slot_mapping});
}

}  // namespace attn_ops
