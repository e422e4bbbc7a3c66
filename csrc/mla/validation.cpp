// Argument checks of the MLA ops (and the output shapes of mla_decode), shared by every backend.
#include "mla/validation.h"

#include "common/attention_checks.h"
#include "common/cache_dtype.h"
#include "common/checks.h"
#include "common/index_checks.h"
#include "common/serving.h"

#include <ATen/ATen.h>

namespace attn_ops {
namespace {

// The latent cache's last dim is d_c + d_rope, the last dims of the tensors `latent_name` and `rope_name`,
// with d_c >= 1 and d_c + d_rope within the head-dim limit of every attention op.
void check_latent_width(const char* op, const at::Tensor& latent_cache, const char* latent_name,
                        const c10::SymInt& d_c, const char* rope_name, const c10::SymInt& d_rope) {
  TORCH_CHECK(d_c >= 1, op, ": kv_lora_rank (the last dim of ", latent_name, ") must be at least 1, got ", d_c);
  TORCH_CHECK(d_c + d_rope <= kMaxHeadDim, op, ": kv_lora_rank + rope_dim must be at most ", kMaxHeadDim, ", got ",
              d_c, " + ", d_rope, " = ", d_c + d_rope);
  TORCH_CHECK(latent_cache.sym_size(-1) == d_c + d_rope, op, ": latent_cache must have last dim kv_lora_rank + ",
              "rope_dim = ", d_c, " + ", d_rope, " = ", d_c + d_rope, " (from ", latent_name, " and ", rope_name,
              "), got ", latent_cache.sym_size(-1));
}

}  // namespace

void check_mla_cache_append_inputs(const at::Tensor& latent_cache, const at::Tensor& c_kv, const at::Tensor& k_pe,
                                   const std::optional<at::Tensor>& cache_seqlens,
                                   const std::optional<at::Tensor>& slot_mapping,
                                   const std::optional<at::Tensor>& cache_batch_idx,
                                   const std::optional<at::Tensor>& kv_scale) {
  const char* op = "attn_ops.mla_cache_append";
  TORCH_CHECK(cache_seqlens.has_value() != slot_mapping.has_value(), op,
              ": exactly one of cache_seqlens (contiguous cache) and slot_mapping (paged cache) must be given, got ",
              cache_seqlens.has_value() ? "both" : "neither");
  const bool paged = slot_mapping.has_value();
  const bool selected = cache_batch_idx.has_value();  // the cache holds any number of rows
  TORCH_CHECK(!(paged && selected), op,
              ": cache_batch_idx selects rows of a contiguous cache; with slot_mapping (paged cache) the slots "
              "already say where each token goes");
  if (paged) {
    check_rank(op, "latent_cache", latent_cache, 3, "[num_blocks, block_size, kv_lora_rank + rope_dim]",
               " when slot_mapping is given");
    check_rank(op, "c_kv", c_kv, 2, "[num_tokens, kv_lora_rank]", " when slot_mapping is given");
  } else {
    check_rank(op, "latent_cache", latent_cache, 3, "[batch, capacity, kv_lora_rank + rope_dim]");
    check_rank(op, "c_kv", c_kv, 3, "[batch, seqlen_new, kv_lora_rank]");
  }
  check_cache_dtype(op, {"latent_cache", latent_cache});
  check_one_device(op, {{"latent_cache", latent_cache}, {"c_kv", c_kv}, {"k_pe", k_pe}});
  check_cache_write_dtypes(op, {"latent_cache", latent_cache}, {{"c_kv", c_kv}, {"k_pe", k_pe}});
  check_cache_scale(op, "kv_scale", kv_scale, 1, {"latent_cache", latent_cache});
  check_last_dim_contiguous(op, "latent_cache", latent_cache);
  check_last_dim_contiguous(op, "c_kv", c_kv);
  check_last_dim_contiguous(op, "k_pe", k_pe);
  const c10::SymIntArrayRef leading = c_kv.sym_sizes().slice(0, c_kv.dim() - 1);
  TORCH_CHECK(k_pe.dim() == c_kv.dim() && k_pe.sym_sizes().slice(0, k_pe.dim() - 1) == leading, op,
              ": k_pe must have shape ", shape_str(leading).insert(shape_str(leading).size() - 1, ", *"),
              " (the leading dims of c_kv), got ", shape_str(k_pe));
  check_latent_width(op, latent_cache, "c_kv", c_kv.sym_size(-1), "k_pe", k_pe.sym_size(-1));
  if (paged) {
    const at::Tensor& slots = *slot_mapping;
    check_index_tensor(op, "slot_mapping", slots, /*allow_int64=*/true,
                       slots.dim() == 1 && slots.sym_size(0) == c_kv.sym_size(0),
                       [&] { return shape_str({c_kv.sym_size(0)}); });
    check_same_device(op, "slot_mapping", slots, "latent_cache", latent_cache);
    if (can_read_values(slots)) {
      check_slot_values(op, slots, latent_cache.size(0), latent_cache.size(1));
    }
  } else {
    const at::Tensor& lens = *cache_seqlens;
    const c10::SymInt batch = selected ? c_kv.sym_size(0) : latent_cache.sym_size(0);
    TORCH_CHECK(c_kv.sym_size(0) == batch, op, ": c_kv must have batch size ", batch, " (as latent_cache), got ",
                c_kv.sym_size(0));
    check_index_tensor(op, "cache_seqlens", lens, /*allow_int64=*/false, lens.dim() == 1 && lens.sym_size(0) == batch,
                       [&] { return shape_str({batch}); });
    check_same_device(op, "cache_seqlens", lens, "latent_cache", latent_cache);
    if (selected) {
      check_write_batch_idx(op, *cache_batch_idx, batch, latent_cache.sym_size(0), "latent_cache", latent_cache,
                            /*distinct=*/true);
    }
    if (can_read_values(lens)) {
      check_append_lengths(op, lens, c_kv.size(1), latent_cache.size(1));
    }
  }
  const at::Tensor& index = paged ? *slot_mapping : *cache_seqlens;
  const at::Tensor& rows = selected ? *cache_batch_idx : index;
  check_in_place_target(op, {"latent_cache", latent_cache},
                        {{"c_kv", c_kv},
                         {"k_pe", k_pe},
                         {paged ? "slot_mapping" : "cache_seqlens", index},
                         {selected ? "cache_batch_idx" : (paged ? "slot_mapping" : "cache_seqlens"), rows}});
}

AttentionCall prepare_mla_decode(const at::Tensor& q_latent, const at::Tensor& q_rope, const at::Tensor& latent_cache,
                                 const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& block_table,
                                 double scale, bool causal, const KvCacheRows& rows,
                                 const std::optional<at::Tensor>& kv_scale) {
  const char* op = "attn_ops.mla_decode";
  const bool paged = block_table.has_value();
  if (rows.packed()) {
    check_rank(op, "q_latent", q_latent, 3, "[total_q, heads, kv_lora_rank]", " when cu_seqlens_q is given");
    check_rank(op, "q_rope", q_rope, 3, "[total_q, heads, rope_dim]", " when cu_seqlens_q is given");
  } else {
    check_rank(op, "q_latent", q_latent, 4, "[batch, seqlen_q, heads, kv_lora_rank]");
    check_rank(op, "q_rope", q_rope, 4, "[batch, seqlen_q, heads, rope_dim]");
  }
  if (paged) {
    check_rank(op, "latent_cache", latent_cache, 3, "[num_blocks, block_size, kv_lora_rank + rope_dim]",
               " when block_table is given");
  } else {
    check_rank(op, "latent_cache", latent_cache, 3, "[batch, capacity, kv_lora_rank + rope_dim]");
  }
  check_cache_read_dtypes(op, {{"q_latent", q_latent}, {"q_rope", q_rope}}, {{"latent_cache", latent_cache}});
  check_cache_scale(op, "kv_scale", kv_scale, 1, {"latent_cache", latent_cache});
  const c10::SymIntArrayRef lead = q_latent.sym_sizes().slice(0, q_latent.dim() - 1);
  TORCH_CHECK(q_rope.sym_sizes().slice(0, q_rope.dim() - 1) == lead, op, ": q_rope must have shape ",
              shape_str(lead).insert(shape_str(lead).size() - 1, ", *"),
              rows.packed() ? " (total_q, heads of q_latent), got " : " (batch, seqlen_q, heads of q_latent), got ",
              shape_str(q_rope));
  const c10::SymInt heads = q_latent.sym_size(-2);
  check_latent_width(op, latent_cache, "q_latent", q_latent.sym_size(-1), "q_rope", q_rope.sym_size(-1));
  // One latent KV head shared by every query head (MQA).
  TORCH_CHECK(heads >= 1, op, ": q_latent must have at least 1 head, got ", heads);
  const c10::SymInt batch = check_kvcache_rows(op, rows, q_latent, "q_latent");
  const bool selected = rows.cache_batch_idx.has_value();  // the cache holds any number of rows
  if (!paged && !selected) {
    TORCH_CHECK(latent_cache.sym_size(0) == batch, op, ": latent_cache must have batch size ", batch,
                " (as q_latent), got ", latent_cache.sym_size(0));
  }
  check_score_options(op, q_latent.scalar_type(), scale, -1, -1, 0.0);
  check_index_tensor(op, "cache_seqlens", cache_seqlens, /*allow_int64=*/false,
                     cache_seqlens.dim() == 1 && cache_seqlens.sym_size(0) == batch,
                     [&] { return shape_str({batch}); });
  check_same_device(op, "cache_seqlens", cache_seqlens, "q_latent", q_latent);
  c10::SymInt capacity = latent_cache.sym_size(1);
  if (paged) {
    const at::Tensor& table = *block_table;
    check_index_tensor(op, "block_table", table, /*allow_int64=*/false,
                       table.dim() == 2 && (selected || table.sym_size(0) == batch),
                       [&] {
                         return c10::str("[", selected ? std::string("table_rows") : c10::str(batch),
                                         ", max_blocks_per_seq]");
                       });
    check_same_device(op, "block_table", table, "q_latent", q_latent);
    capacity = table.sym_size(1) * latent_cache.sym_size(1);
  }
  if (can_read_values(cache_seqlens) && can_read_values(q_latent)) {
    check_kvcache_row_values(op, rows, q_latent.size(0), paged ? block_table->size(0) : latent_cache.size(0),
                             paged ? "block_table" : "latent_cache", cache_seqlens,
                             paged ? *block_table : at::Tensor(), capacity.expect_int(),
                             paged ? latent_cache.size(1) : 0, paged ? latent_cache.size(0) : 0);
  }
  const c10::SymInt d_c = q_latent.sym_size(-1);
  AttentionCall call;
  call.op = op;
  call.cache_name = "latent_cache";
  call.q = at::cat({q_latent, q_rope}, -1);  // [B, Tq, H, d_c + d_rope] (packed: [total_q, H, ..])
  call.k = latent_cache.unsqueeze(-2);        // the whole latent row, one KV head
  call.v = latent_cache.narrow_symint(-1, 0, d_c).unsqueeze(-2);  // its first d_c features
  call.set_cache_rows(cache_seqlens, block_table, rows);
  call.given_scale = scale;
  call.causal = causal;
  call.cache_scales = CacheScales{kv_scale, kv_scale};  // one scale for every latent column
  call.batch = batch;
  call.seqlen_q = rows.packed() ? q_latent.sym_size(0) : q_latent.sym_size(1);
  call.seqlen_k = capacity;
  call.heads_q = heads;
  call.heads_kv = 1;
  call.head_dim_qk = latent_cache.sym_size(-1);
  call.head_dim_v = d_c;
  const auto& s = q_latent.sym_sizes();
  call.outputs = OutLseSizes{
      s.vec(), rows.packed() ? std::vector<c10::SymInt>{s[1], s[0]} : std::vector<c10::SymInt>{s[0], s[2], s[1]},
      attention_lse_dtype(q_latent.scalar_type())};
  return call;
}

}  // namespace attn_ops
