// CPU backend of attention / attention_backward / attention_with_kvcache (and of mla_decode, which runs on
// attention_forward): the prepared call turned into the kernels' problem and layouts, and dispatch to the
// forward, backward and decode kernels by dtype (attention/entry.h does the preparation and the output
// allocation).
#include "attention/entry.h"
#include "common/attention_call.h"
#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/decode_cpu.h"
#include "attention/cpu/row_ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>

namespace attn_ops::cpu {

namespace {

// Int32 [n] values (cu_seqlens, cache_seqlens, cache_batch_idx, cache_leftpad), or `fallback(i)` when not given.
template <typename Fallback>
std::vector<int64_t> host_values(const std::optional<at::Tensor>& t, int64_t n, const Fallback& fallback) {
  std::vector<int64_t> out(n);
  const at::Tensor host = t.has_value() ? t->contiguous() : at::Tensor();
  for (int64_t i = 0; i < n; ++i) {
    out[i] = host.defined() ? host.const_data_ptr<int32_t>()[i] : fallback(i);
  }
  return out;
}

int64_t zero(int64_t) { return 0; }

}  // namespace

AttentionProblem make_problem(const AttentionCall& call) {
  AttentionProblem p;
  p.batch = call.batch.expect_int();
  p.heads_q = call.heads_q.expect_int();
  p.heads_kv = call.heads_kv.expect_int();
  p.group = p.heads_q / p.heads_kv;
  p.dim_qk = call.head_dim_qk.expect_int();
  p.dim_v = call.head_dim_v.expect_int();
  p.scale = call.scale();
  p.softcap = call.softcap;
  const int64_t tokens_q = call.seqlen_q.expect_int();
  p.total_q = call.packed_q() ? tokens_q : p.batch * tokens_q;
  // Packed queries start at cu_seqlens_q[b]; dense ones at b * Tq.
  const std::vector<int64_t> cu_q = call.packed_q() ? host_values(call.cu_seqlens_q, p.batch + 1, zero) : std::vector<int64_t>{};
  for (int64_t b = 0; b < p.batch; ++b) {
    p.len_q.push_back(call.packed_q() ? cu_q[b + 1] - cu_q[b] : tokens_q);
    p.token_q.push_back(call.packed_q() ? cu_q[b] : b * tokens_q);
  }
  if (call.over_cache()) {
    // Row b's keys are cache positions cache_leftpad[b] .. cache_seqlens[b] - 1; its queries are the last
    // len_q[b] of them (bottom-right alignment).
    const std::vector<int64_t> lens = host_values(call.cache_seqlens, p.batch, zero);
    const std::vector<int64_t> first_key = host_values(call.cache_leftpad, p.batch, zero);
    for (int64_t b = 0; b < p.batch; ++b) {
      p.len_k.push_back(lens[b] - first_key[b]);
    }
  } else if (call.varlen()) {
    const std::vector<int64_t> cu_k = host_values(call.cu_seqlens_k, p.batch + 1, zero);
    for (int64_t b = 0; b < p.batch; ++b) {
      p.len_k.push_back(cu_k[b + 1] - cu_k[b]);
    }
  } else {
    p.len_k.assign(p.batch, call.seqlen_k.expect_int());
  }
  p.set_windows(call.window_left, call.effective_window_right(), call.patterns.attention_chunk);
  p.max_splits = call.num_splits;
  if (call.patterns.sinks.has_value()) {
    const at::Tensor sinks = call.patterns.sinks->to(at::kDouble).contiguous();
    p.sinks.assign(sinks.const_data_ptr<double>(), sinks.const_data_ptr<double>() + p.heads_q);
  }
  if (call.cache_8bit()) {
    p.cache_8bit = call.k.scalar_type() == at::kFloat8_e4m3fn ? Cache8Bit::e4m3fn : Cache8Bit::e5m2;
    p.k_scale = scale_per_head(call.cache_scales.k, p.heads_kv);
    p.v_scale = scale_per_head(call.cache_scales.v, p.heads_kv);
  }
  if (call.patterns.alibi_slopes.has_value()) {  // [heads_q] or [batch, heads_q]
    const at::Tensor slopes = call.patterns.alibi_slopes->expand({p.batch, p.heads_q}).contiguous();
    p.alibi.assign(slopes.const_data_ptr<float>(), slopes.const_data_ptr<float>() + p.batch * p.heads_q);
  }
  return p;
}

namespace {

// The stride of dim d, 0 for a dim of size 1: PyTorch gives such dims any stride (even a huge one), and
// reading it as 0 keeps every offset and BLAS leading dimension derived from it small.
int64_t stride_of(const at::Tensor& t, int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); }

// [batch, seqlen, heads, dim] (packed: [total, heads, dim], sequence b from token starts[b] on).
SeqLayout token_layout(const at::Tensor& t, const AttentionProblem& p, bool packed, const std::vector<int64_t>& starts) {
  SeqLayout l;
  l.seq_stride = stride_of(t, packed ? 0 : 1);
  l.head_stride = stride_of(t, packed ? 1 : 2);
  for (int64_t b = 0; b < p.batch; ++b) {
    l.base.push_back(packed ? starts[b] * l.seq_stride : b * stride_of(t, 0));
  }
  return l;
}

// lse: [batch, heads, seqlen] (packed: [heads, total]).
SeqLayout lse_layout(const at::Tensor& t, const AttentionProblem& p, bool packed) {
  SeqLayout l;
  l.seq_stride = stride_of(t, packed ? 1 : 2);
  l.head_stride = stride_of(t, packed ? 0 : 1);
  for (int64_t b = 0; b < p.batch; ++b) {
    l.base.push_back(packed ? p.token_q[b] * l.seq_stride : b * stride_of(t, 0));
  }
  return l;
}

// Where a call's sequences sit in its cache, read once for the K and V layouts: sequence b reads cache (or
// block-table) row row[b] = cache_batch_idx[b] (default b) from cache position first_key[b] = cache_leftpad[b]
// (default 0) on; `table` is the contiguous block table when paged (the layouts point into it).
struct CacheRows {
  at::Tensor table;
  std::vector<int64_t> row, first_key;

  explicit CacheRows(const AttentionCall& call)
      : table(call.paged() ? call.block_table->contiguous() : at::Tensor()),
        row(host_values(call.cache_batch_idx, call.batch.expect_int(), [](int64_t b) { return b; })),
        first_key(host_values(call.cache_leftpad, call.batch.expect_int(), zero)) {}
};

// Layout of a KV cache: [rows, capacity, heads, dim] rows, or [num_blocks, block_size, heads, dim] blocks
// addressed through the block table.
KeyLayout cache_layout(const at::Tensor& cache, const AttentionCall& call, const CacheRows& rows) {
  const std::vector<int64_t>& cache_row = rows.row;
  const std::vector<int64_t>& first_key = rows.first_key;
  const at::Tensor& table = rows.table;
  KeyLayout l;
  l.rows.seq_stride = stride_of(cache, 1);
  l.rows.head_stride = stride_of(cache, 2);
  if (call.paged()) {
    l.block_table = table.const_data_ptr<int32_t>();
    l.block_table_stride = stride_of(table, 0);
    l.block_size = cache.size(1);
    l.block_stride = stride_of(cache, 0);
    l.table_row = cache_row;
    if (call.cache_leftpad.has_value()) {
      l.first_key = first_key;
    }
  } else {
    for (size_t b = 0; b < cache_row.size(); ++b) {
      l.rows.base.push_back(cache_row[b] * stride_of(cache, 0) + first_key[b] * l.rows.seq_stride);
    }
  }
  return l;
}

// The token layouts of a call's queries (and outputs) and of its dense or varlen keys (and values).
struct TokenLayouts {
  const AttentionProblem& p;
  bool packed_q, varlen_k;
  std::vector<int64_t> k_starts;  // varlen: cu_seqlens_k

  TokenLayouts(const AttentionProblem& problem, const AttentionCall& call)
      : p(problem), packed_q(call.packed_q()), varlen_k(call.varlen()),
        k_starts(call.varlen() ? host_values(call.cu_seqlens_k, problem.batch, zero) : std::vector<int64_t>{}) {}
  SeqLayout queries(const at::Tensor& t) const { return token_layout(t, p, packed_q, p.token_q); }
  SeqLayout keys(const at::Tensor& t) const { return token_layout(t, p, varlen_k, k_starts); }
  SeqLayout lse(const at::Tensor& t) const { return lse_layout(t, p, packed_q); }
};

}  // namespace

void attention_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse) {
  const AttentionProblem p = make_problem(call);
  const TokenLayouts layouts(p, call);
  const std::optional<CacheRows> rows = call.over_cache() ? std::optional<CacheRows>(call) : std::nullopt;
  const KeyLayout k_layout = rows ? cache_layout(call.k, call, *rows) : KeyLayout{layouts.keys(call.k)};
  const KeyLayout v_layout = rows ? cache_layout(call.v, call, *rows) : KeyLayout{layouts.keys(call.v)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, call.q.scalar_type(), "attn_ops.attention_forward", [&] {
    using acc_t = acc_type<scalar_t>;
    // decode-shaped sequences (a few query rows against many keys: a serving step, or transformers' generation
    // steps through attention) on the decode kernel, the others on the tiled one
    if (p.cache_8bit == Cache8Bit::none) {
      routed_forward_kernel<scalar_t, acc_t>(
          p, call.q.const_data_ptr<scalar_t>(), layouts.queries(call.q), call.k.const_data_ptr<scalar_t>(), k_layout,
          call.v.const_data_ptr<scalar_t>(), v_layout, out.mutable_data_ptr<scalar_t>(), layouts.queries(out),
          lse.mutable_data_ptr<acc_t>(), layouts.lse(lse));
    } else if constexpr (!std::is_same_v<scalar_t, double>) {  // the preparation refuses float64 q with 8-bit caches
      routed_forward_kernel<scalar_t, acc_t, uint8_t>(
          p, call.q.const_data_ptr<scalar_t>(), layouts.queries(call.q),
          static_cast<const uint8_t*>(call.k.const_data_ptr()), k_layout,
          static_cast<const uint8_t*>(call.v.const_data_ptr()), v_layout, out.mutable_data_ptr<scalar_t>(),
          layouts.queries(out), lse.mutable_data_ptr<acc_t>(), layouts.lse(lse));
    }
  });
}

namespace {

void attention_backward_cpu(const AttentionBackwardCall& call, const at::Tensor& dq, const at::Tensor& dk,
                            const at::Tensor& dv) {
  const AttentionProblem p = make_problem(call);
  const TokenLayouts layouts(p, call);
  // lse and dlse are read through one layout; make them share strides.
  const at::Tensor lse = call.lse.contiguous();
  const std::optional<at::Tensor> dlse =
      call.dlse.has_value() ? std::optional(call.dlse->contiguous()) : std::nullopt;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, call.q.scalar_type(), "attn_ops.attention_backward", [&] {
    using acc_t = acc_type<scalar_t>;
    attention_backward_kernel<scalar_t, acc_t>(
        p, call.dout.const_data_ptr<scalar_t>(), layouts.queries(call.dout), call.q.const_data_ptr<scalar_t>(),
        layouts.queries(call.q), call.k.const_data_ptr<scalar_t>(), layouts.keys(call.k),
        call.v.const_data_ptr<scalar_t>(), layouts.keys(call.v), call.out.const_data_ptr<scalar_t>(),
        layouts.queries(call.out), lse.const_data_ptr<acc_t>(),
        dlse.has_value() ? dlse->const_data_ptr<acc_t>() : nullptr, layouts.lse(lse),
        dq.mutable_data_ptr<scalar_t>(), layouts.queries(dq), dk.mutable_data_ptr<scalar_t>(), layouts.keys(dk),
        dv.mutable_data_ptr<scalar_t>(), layouts.keys(dv));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("attention", &attention_on<attention_forward>);
  m.impl("attention_backward", &attention_backward_on<attention_backward_cpu>);
  m.impl("attention_with_kvcache", &attention_with_kvcache_on<attention_forward>);
}

}  // namespace attn_ops::cpu
