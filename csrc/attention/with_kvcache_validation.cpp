// Preparation of attention_with_kvcache (argument checks, values of the index tensors when they hold data,
// the output shapes) into the AttentionCall every backend takes.
#include "attention/validation.h"

#include "common/attention_checks.h"
#include "common/cache_dtype.h"
#include "common/checks.h"
#include "common/index_checks.h"
#include "common/serving.h"

#include <ATen/ATen.h>

namespace attn_ops {

AttentionCall prepare_attention_with_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                                             const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                             const std::optional<at::Tensor>& block_table, std::optional<double> scale,
                                             bool causal, int64_t window_left, int64_t window_right, double softcap,
                                             const KvCacheRows& rows, const PatternOptions& patterns,
                                             int64_t num_splits, const CacheScales& scales) {
  const char* op = "attn_ops.attention_with_kvcache";
  const bool paged = block_table.has_value();
  if (rows.packed()) {
    check_rank(op, "q", q, 3, "[total_q, heads_q, head_dim]", " when cu_seqlens_q is given");
  } else {
    check_rank(op, "q", q, 4, "[batch, seqlen_q, heads_q, head_dim]");
  }
  if (paged) {
    check_rank(op, "k_cache", k_cache, 4, "[num_blocks, block_size, heads_kv, head_dim]", " when block_table is given");
    check_rank(op, "v_cache", v_cache, 4, "[num_blocks, block_size, heads_kv, head_dim_v]",
               " when block_table is given");
  } else {
    check_rank(op, "k_cache", k_cache, 4, "[batch, capacity, heads_kv, head_dim]");
    check_rank(op, "v_cache", v_cache, 4, "[batch, capacity, heads_kv, head_dim_v]");
  }
  check_cache_read_dtypes(op, {{"q", q}}, {{"k_cache", k_cache}, {"v_cache", v_cache}});

  AttentionCall s;
  s.op = op;
  s.batch = check_kvcache_rows(op, rows, q, "q");
  s.seqlen_q = rows.packed() ? q.sym_size(0) : q.sym_size(1);
  s.heads_q = q.sym_size(-2);
  s.heads_kv = k_cache.sym_size(2);
  s.head_dim_qk = q.sym_size(-1);
  s.head_dim_v = v_cache.sym_size(3);
  const bool selected = rows.cache_batch_idx.has_value();  // the cache holds any number of rows
  if (!paged && !selected) {
    TORCH_CHECK(k_cache.sym_size(0) == s.batch, op, ": k_cache must have batch size ", s.batch, " (as q), got ",
                k_cache.sym_size(0));
  }
  const auto& kc = k_cache.sym_sizes();
  TORCH_CHECK(v_cache.sym_size(0) == kc[0] && v_cache.sym_size(1) == kc[1] && v_cache.sym_size(2) == kc[2], op,
              ": v_cache must have shape [", kc[0], ", ", kc[1], ", ", kc[2], ", *] (as k_cache), got ",
              shape_str(v_cache));
  check_head_counts(op, s.heads_q, s.heads_kv);
  TORCH_CHECK(k_cache.sym_size(3) == s.head_dim_qk, op, ": k_cache must have head_dim ", s.head_dim_qk, " (as q), got ",
              k_cache.sym_size(3));
  check_head_dims(op, s.head_dim_qk, s.head_dim_v);
  check_score_options(op, q.scalar_type(), scale, window_left, window_right, softcap);
  check_pattern_options(op, q, s.batch, s.heads_q, patterns);
  check_cache_scale(op, "k_scale", scales.k, s.heads_kv, {"k_cache", k_cache});
  check_cache_scale(op, "v_scale", scales.v, s.heads_kv, {"v_cache", v_cache});
  TORCH_CHECK(num_splits >= 0, op, ": num_splits must be >= 0 (0: automatic, 1: no split), got ", num_splits);

  check_index_tensor(op, "cache_seqlens", cache_seqlens, /*allow_int64=*/false,
                     cache_seqlens.dim() == 1 && cache_seqlens.sym_size(0) == s.batch,
                     [&] { return shape_str({s.batch}); });
  check_same_device(op, "cache_seqlens", cache_seqlens, "q", q);
  if (paged) {
    const at::Tensor& table = *block_table;
    check_index_tensor(op, "block_table", table, /*allow_int64=*/false,
                       table.dim() == 2 && (selected || table.sym_size(0) == s.batch),
                       [&] {
                         return c10::str("[", selected ? std::string("table_rows") : c10::str(s.batch),
                                         ", max_blocks_per_seq]");
                       });
    check_same_device(op, "block_table", table, "q", q);
    s.seqlen_k = table.sym_size(1) * k_cache.sym_size(1);
  } else {
    s.seqlen_k = k_cache.sym_size(1);
  }

  if (can_read_values(cache_seqlens) && can_read_values(q)) {
    check_kvcache_row_values(op, rows, s.seqlen_q.expect_int(), paged ? block_table->size(0) : k_cache.size(0),
                             paged ? "block_table" : "k_cache", cache_seqlens, paged ? *block_table : at::Tensor(),
                             s.seqlen_k.expect_int(), paged ? k_cache.size(1) : 0, paged ? k_cache.size(0) : 0);
  }
  s.q = q;
  s.k = k_cache;
  s.v = v_cache;
  s.set_cache_rows(cache_seqlens, block_table, rows);
  s.given_scale = scale;
  s.causal = causal;
  s.window_left = window_left;
  s.window_right = window_right;
  s.softcap = softcap;
  s.patterns = patterns;
  s.num_splits = num_splits;
  s.cache_scales = scales;
  const c10::ScalarType lse_dtype = attention_lse_dtype(q.scalar_type());
  s.outputs = rows.packed() ? OutLseSizes{{s.seqlen_q, s.heads_q, s.head_dim_v}, {s.heads_q, s.seqlen_q}, lse_dtype}
                       : OutLseSizes{{s.batch, s.seqlen_q, s.heads_q, s.head_dim_v}, {s.batch, s.heads_q, s.seqlen_q},
                                     lse_dtype};
  return s;
}

}  // namespace attn_ops
