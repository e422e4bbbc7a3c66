// CPU backend of attention / attention_backward / attention_with_kvcache: the prepared problem turned into
// layouts, and dispatch to the forward, backward and decode kernels by dtype (attention/entry.h does the
// shared preparation and the output allocation).
#include "attention/entry.h"
#include "attention/validation.h"
#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/decode_cpu.h"
#include "attention/cpu/row_ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cmath>

namespace attn_ops::cpu {

AttentionProblem make_problem(const AttentionPrep& prep) {
  const AttentionShape& shape = prep.shape;
  const AttentionOptions& opts = prep.opts;
  AttentionProblem p;
  p.batch = shape.batch.expect_int();
  p.heads_q = shape.heads_q.expect_int();
  p.heads_kv = shape.heads_kv.expect_int();
  p.group = p.heads_q / p.heads_kv;
  p.dim_qk = shape.head_dim_qk.expect_int();
  p.dim_v = shape.head_dim_v.expect_int();
  p.scale = prep.scale();
  p.softcap = opts.softcap;
  p.len_q.resize(p.batch);
  p.len_k.resize(p.batch);
  p.token_q.resize(p.batch);
  if (shape.varlen) {
    const at::Tensor cu_q = opts.cu_seqlens_q->contiguous(), cu_k = opts.cu_seqlens_k->contiguous();
    const int32_t *cq = cu_q.data_ptr<int32_t>(), *ck = cu_k.data_ptr<int32_t>();
    for (int64_t b = 0; b < p.batch; ++b) {
      p.len_q[b] = cq[b + 1] - cq[b];
      p.len_k[b] = ck[b + 1] - ck[b];
      p.token_q[b] = cq[b];
    }
  } else {
    for (int64_t b = 0; b < p.batch; ++b) {
      p.len_q[b] = shape.seqlen_q.expect_int();
      p.len_k[b] = shape.seqlen_k.expect_int();
      p.token_q[b] = b * p.len_q[b];
    }
  }
  p.total_q = shape.varlen ? shape.seqlen_q.expect_int() : p.batch * shape.seqlen_q.expect_int();
  p.set_windows(opts.window_left, opts.effective_window_right());
  return p;
}

namespace {

// Token starts of the sequences: cu_seqlens for varlen, none for dense (the batch stride does it).
std::vector<int64_t> token_starts(const AttentionProblem& p, const AttentionOptions& opts, bool keys) {
  std::vector<int64_t> starts(p.batch, 0);
  if (opts.varlen()) {
    const at::Tensor cu = (keys ? *opts.cu_seqlens_k : *opts.cu_seqlens_q).contiguous();
    for (int64_t b = 0; b < p.batch; ++b) {
      starts[b] = cu.data_ptr<int32_t>()[b];
    }
  }
  return starts;
}

// The stride of dim d, 0 for a dim of size 1: PyTorch gives such dims any stride (even a huge one), and
// reading it as 0 keeps every offset and BLAS leading dimension derived from it small.
int64_t stride_of(const at::Tensor& t, int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); }

SeqLayout layout_of(const at::Tensor& t, const AttentionProblem& p, const std::vector<int64_t>& starts, bool varlen,
                    int64_t seq_dim, int64_t head_dim) {
  SeqLayout l;
  l.seq_stride = stride_of(t, seq_dim);
  l.head_stride = stride_of(t, head_dim);
  l.base.resize(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) {
    l.base[b] = varlen ? starts[b] * l.seq_stride : b * stride_of(t, 0);
  }
  return l;
}

struct Layouts {
  std::vector<int64_t> q_starts, k_starts;
  bool varlen;
  SeqLayout tokens(const at::Tensor& t, const AttentionProblem& p, bool keys) const {
    return varlen ? layout_of(t, p, keys ? k_starts : q_starts, true, 0, 1) : layout_of(t, p, {}, false, 1, 2);
  }
  SeqLayout lse(const at::Tensor& t, const AttentionProblem& p) const {
    return varlen ? layout_of(t, p, q_starts, true, 1, 0) : layout_of(t, p, {}, false, 2, 1);
  }
};

Layouts make_layouts(const AttentionProblem& p, const AttentionOptions& opts) {
  return Layouts{token_starts(p, opts, false), token_starts(p, opts, true), opts.varlen()};
}

void attention_cpu(const AttentionPrep& prep, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& out, const at::Tensor& lse) {
  const AttentionProblem p = make_problem(prep);
  const Layouts layouts = make_layouts(p, prep.opts);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention", [&] {
    using acc_t = acc_type<scalar_t>;
    // decode-shaped sequences (a few query rows against many keys, as transformers' generation steps call this
    // op) on the decode kernel, the others on the tiled one
    routed_forward_kernel<scalar_t, acc_t>(
        p, q.const_data_ptr<scalar_t>(), layouts.tokens(q, p, false), k.const_data_ptr<scalar_t>(),
        KeyLayout{layouts.tokens(k, p, true)}, v.const_data_ptr<scalar_t>(), KeyLayout{layouts.tokens(v, p, true)},
        out.mutable_data_ptr<scalar_t>(), layouts.tokens(out, p, false), lse.mutable_data_ptr<acc_t>(),
        layouts.lse(lse, p));
  });
}

void attention_backward_cpu(const AttentionPrep& prep, const at::Tensor& dout, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                            const std::optional<at::Tensor>& dlse, const at::Tensor& dq, const at::Tensor& dk,
                            const at::Tensor& dv) {
  const AttentionProblem p = make_problem(prep);
  const Layouts layouts = make_layouts(p, prep.opts);
  // lse and dlse are read through one layout; make them share strides.
  const at::Tensor lse_c = lse.contiguous();
  const std::optional<at::Tensor> dlse_c = dlse.has_value() ? std::optional(dlse->contiguous()) : std::nullopt;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention_backward", [&] {
    using acc_t = acc_type<scalar_t>;
    attention_backward_kernel<scalar_t, acc_t>(
        p, dout.const_data_ptr<scalar_t>(), layouts.tokens(dout, p, false), q.const_data_ptr<scalar_t>(),
        layouts.tokens(q, p, false), k.const_data_ptr<scalar_t>(), layouts.tokens(k, p, true),
        v.const_data_ptr<scalar_t>(), layouts.tokens(v, p, true), out.const_data_ptr<scalar_t>(),
        layouts.tokens(out, p, false), lse_c.const_data_ptr<acc_t>(),
        dlse_c.has_value() ? dlse_c->const_data_ptr<acc_t>() : nullptr, layouts.lse(lse_c, p),
        dq.mutable_data_ptr<scalar_t>(), layouts.tokens(dq, p, false), dk.mutable_data_ptr<scalar_t>(),
        layouts.tokens(dk, p, true), dv.mutable_data_ptr<scalar_t>(), layouts.tokens(dv, p, true));
  });
}

// Int32 [batch] per-row values (cache_batch_idx, cache_leftpad), or `fallback(b)` when not given.
template <typename Fallback>
std::vector<int64_t> row_values(const std::optional<at::Tensor>& t, int64_t batch, const Fallback& fallback) {
  std::vector<int64_t> out(batch);
  const at::Tensor host = t.has_value() ? t->contiguous() : at::Tensor();
  for (int64_t b = 0; b < batch; ++b) {
    out[b] = host.defined() ? host.const_data_ptr<int32_t>()[b] : fallback(b);
  }
  return out;
}

// Layout of a KV cache: [rows, capacity, heads, dim] rows, or [num_blocks, block_size, heads, dim] blocks
// addressed through the block table. Sequence b reads cache (or block-table) row cache_row[b], from cache
// position first_key[b] on.
KeyLayout cache_layout(const at::Tensor& cache, const at::Tensor* block_table, const std::vector<int64_t>& cache_row,
                       const std::vector<int64_t>& first_key, bool left_padded) {
  KeyLayout l;
  l.rows.seq_stride = stride_of(cache, 1);
  l.rows.head_stride = stride_of(cache, 2);
  if (block_table != nullptr) {
    l.block_table = block_table->const_data_ptr<int32_t>();
    l.block_table_stride = stride_of(*block_table, 0);
    l.block_size = cache.size(1);
    l.block_stride = stride_of(cache, 0);
    l.table_row = cache_row;
    if (left_padded) {
      l.first_key = first_key;
    }
  } else {
    l.rows.base.resize(cache_row.size());
    for (size_t b = 0; b < cache_row.size(); ++b) {
      l.rows.base[b] = cache_row[b] * stride_of(cache, 0) + first_key[b] * l.rows.seq_stride;
    }
  }
  return l;
}

}  // namespace

void kvcache_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& block_table, double scale,
                       bool causal, int64_t window_left, int64_t window_right, double softcap, const KvCacheRows& rows,
                       const at::Tensor& out, const at::Tensor& lse) {
  const bool packed = rows.packed();
  const int64_t batch = cache_seqlens.size(0), heads_q = q.size(-2), tokens_q = packed ? q.size(0) : q.size(1);

  // Row b's keys are cache positions first_key[b] .. cache_seqlens[b] - 1 of cache row cache_row[b]; its
  // queries are the last len_q[b] of them (bottom-right alignment).
  const std::vector<int64_t> cache_row = row_values(rows.cache_batch_idx, batch, [](int64_t b) { return b; });
  const std::vector<int64_t> first_key = row_values(rows.cache_leftpad, batch, [](int64_t) { return int64_t{0}; });
  const std::vector<int64_t> cu_q =
      packed ? row_values(rows.cu_seqlens_q, batch + 1, [](int64_t) { return int64_t{0}; }) : std::vector<int64_t>{};
  AttentionProblem p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = k_cache.size(2);
  p.group = p.heads_q / p.heads_kv;
  p.dim_qk = q.size(-1);
  p.dim_v = v_cache.size(3);
  p.scale = scale;
  p.softcap = softcap;
  p.total_q = packed ? tokens_q : batch * tokens_q;
  const at::Tensor lens = cache_seqlens.contiguous();
  for (int64_t b = 0; b < batch; ++b) {
    p.len_q.push_back(packed ? cu_q[b + 1] - cu_q[b] : tokens_q);
    p.len_k.push_back(lens.const_data_ptr<int32_t>()[b] - first_key[b]);
    p.token_q.push_back(packed ? cu_q[b] : b * tokens_q);
  }
  p.set_windows(window_left, causal ? 0 : window_right);

  const at::Tensor table = block_table.has_value() ? block_table->contiguous() : at::Tensor();
  const at::Tensor* table_ptr = block_table.has_value() ? &table : nullptr;
  const bool left_padded = rows.cache_leftpad.has_value();
  // Queries, outputs and lse: dense [B, Tq, ...] / [B, Hq, Tq], or packed by token_q.
  auto tokens = [&](const at::Tensor& t) {
    return packed ? layout_of(t, p, p.token_q, true, 0, 1) : layout_of(t, p, {}, false, 1, 2);
  };
  const SeqLayout lse_layout = packed ? layout_of(lse, p, p.token_q, true, 1, 0) : layout_of(lse, p, {}, false, 2, 1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention_with_kvcache", [&] {
    using acc_t = acc_type<scalar_t>;
    routed_forward_kernel<scalar_t, acc_t>(
        p, q.const_data_ptr<scalar_t>(), tokens(q), k_cache.const_data_ptr<scalar_t>(),
        cache_layout(k_cache, table_ptr, cache_row, first_key, left_padded), v_cache.const_data_ptr<scalar_t>(),
        cache_layout(v_cache, table_ptr, cache_row, first_key, left_padded), out.mutable_data_ptr<scalar_t>(),
        tokens(out), lse.mutable_data_ptr<acc_t>(), lse_layout);
  });
}

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("attention", &attention_on<attention_cpu>);
  m.impl("attention_backward", &attention_backward_on<attention_backward_cpu>);
  m.impl("attention_with_kvcache", &attention_with_kvcache_on<kvcache_attention>);
}

}  // namespace attn_ops::cpu
