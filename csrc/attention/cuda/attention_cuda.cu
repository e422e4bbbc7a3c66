// CUDA kernels of attention / attention_backward / attention_with_kvcache: the shared validation, output
// allocation, and the device-side problem description handed to the launchers (attention_launch.cu).
// Nothing here reads a tensor's values on the host except the validation (skipped under CUDA-graph
// capture) and, for varlen without max_seqlen_q / max_seqlen_k, the longest sequence.
#include "attention/cuda/attention_cuda.h"
#include "attention/kvcache_entry.h"
#include "attention/validation.h"
#include "common/checks.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

namespace attn_ops::cuda {
namespace {

// [batch, seqlen, heads, dim] (dense) or [total, heads, dim] (varlen).
TokenLayout token_layout(const at::Tensor& t, bool varlen) {
  if (varlen) {
    return TokenLayout{0, t.stride(0), t.stride(1)};
  }
  return TokenLayout{t.stride(0), t.stride(1), t.stride(2)};
}

// A contiguous lse: [batch, heads, seqlen] (dense) or [heads, total] (varlen).
LseLayout lse_layout(const at::Tensor& lse, bool varlen) {
  if (varlen) {
    return LseLayout{0, lse.size(1)};
  }
  return LseLayout{lse.size(1) * lse.size(2), lse.size(2)};
}

// Windows longer than `longest` are unbounded, which keeps the kernels' index arithmetic far from overflow.
Window make_window(int64_t left, int64_t right, int64_t longest) {
  return Window{left > longest ? -1 : left, right > longest ? -1 : right};
}

// Longest sequence of cu_seqlens: the given bound, else read on the device (a sync), else (under graph
// capture, where nothing may be read) the packed total, an upper bound.
int64_t longest_sequence(const at::Tensor& cu, std::optional<int64_t> given, int64_t total) {
  if (given.has_value()) {
    return std::min(*given, total);
  }
  if (!can_read_values(cu) || cu.numel() < 2) {
    return cu.numel() < 2 ? 0 : total;
  }
  return (cu.narrow(0, 1, cu.numel() - 1) - cu.narrow(0, 0, cu.numel() - 1)).max().item<int64_t>();
}

// Key splits for flash-decoding: enough (sequence, KV head, 64-row tile) work items to fill the GPU twice,
// at most one split per 256 keys and 64 in all.
int64_t choose_splits(int64_t batch, int64_t heads_kv, int64_t group, int64_t max_len_q, int64_t max_len_k) {
  const int64_t items = batch * heads_kv * ceil_div(max_len_q * group, 64);
  const int64_t target = 2 * static_cast<int64_t>(sm_count());
  if (items >= target || max_len_k <= 512) {
    return 1;
  }
  return std::clamp<int64_t>(std::min(ceil_div(target, items), ceil_div(max_len_k, 256)), 1, 64);
}

// ForwardArgs with its tensors' data set (the rest left to the caller).
template <typename T>
ForwardArgs<T> forward_tensors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                               at::Tensor& lse) {
  ForwardArgs<T> a{};
  a.q = q.const_data_ptr<T>();
  a.k = k.const_data_ptr<T>();
  a.v = v.const_data_ptr<T>();
  a.out = out.mutable_data_ptr<T>();
  a.lse = lse.mutable_data_ptr<acc_t<T>>();
  return a;
}

// The fields ForwardArgs and BackwardArgs share for attention / attention_backward: sequences (cu_q, cu_k:
// contiguous cu_seqlens, undefined when dense), window, logit, sizes.
template <typename Args>
void set_problem(Args& a, const AttentionShape& shape, const AttentionOptions& opts, const at::Tensor& cu_q,
                 const at::Tensor& cu_k) {
  using A = decltype(a.logit.scale);
  const int64_t total_q = shape.seqlen_q.expect_int(), total_k = shape.seqlen_k.expect_int();
  a.seqs = SeqInfo{cu_q.defined() ? cu_q.const_data_ptr<int32_t>() : nullptr,
                   cu_k.defined() ? cu_k.const_data_ptr<int32_t>() : nullptr, nullptr, total_q, total_k};
  a.window = make_window(opts.window_left, opts.effective_window_right(), std::max(total_q, total_k));
  a.logit = Logit<A>{static_cast<A>(attention_scale(shape, opts)), static_cast<A>(opts.softcap)};
  a.batch = shape.batch.expect_int();
  a.heads_q = shape.heads_q.expect_int();
  a.group = a.heads_q / shape.heads_kv.expect_int();
  a.dim_qk = shape.head_dim_qk.expect_int();
  a.dim_v = shape.head_dim_v.expect_int();
}

// Allocates the split-KV partial buffers of `a` (kept alive by the returned tensors) and sets keys_per_split.
template <typename T>
std::pair<at::Tensor, at::Tensor> set_splits(ForwardArgs<T>& a, int64_t splits, int64_t max_len_k,
                                             const at::TensorOptions& options) {
  a.splits = splits;
  a.keys_per_split = ceil_div(std::max<int64_t>(max_len_k, 1), splits);
  if (splits == 1) {
    return {};
  }
  const auto acc = options.dtype(c10::CppTypeToScalarType<acc_t<T>>::value);
  at::Tensor out = at::empty({splits, a.batch, a.max_len_q, a.heads_q, a.dim_v}, acc);
  at::Tensor lse = at::empty({splits, a.batch, a.max_len_q, a.heads_q}, acc);
  a.partial_out = out.mutable_data_ptr<acc_t<T>>();
  a.partial_lse = lse.mutable_data_ptr<acc_t<T>>();
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  std::optional<double> scale, bool causal, int64_t window_left,
                                                  int64_t window_right, double softcap,
                                                  const std::optional<at::Tensor>& cu_seqlens_q,
                                                  const std::optional<at::Tensor>& cu_seqlens_k,
                                                  std::optional<int64_t> max_seqlen_q,
                                                  std::optional<int64_t> max_seqlen_k) {
  const AttentionOptions opts = make_attention_options(scale, causal, window_left, window_right, softcap,
                                                       cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  const AttentionShape shape = check_attention_inputs("attn_ops.attention", q, k, v, opts);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty_symint(attention_out_shape(shape), q.options());
  at::Tensor lse =
      at::empty_symint(attention_lse_shape(shape), q.options().dtype(attention_lse_dtype(q.scalar_type())));
  const bool varlen = shape.varlen;
  const int64_t total_q = shape.seqlen_q.expect_int(), total_k = shape.seqlen_k.expect_int();
  const at::Tensor cu_q = varlen ? cu_seqlens_q->contiguous() : at::Tensor();
  const at::Tensor cu_k = varlen ? cu_seqlens_k->contiguous() : at::Tensor();
  const int64_t max_len_q = varlen ? longest_sequence(cu_q, max_seqlen_q, total_q) : total_q;
  const int64_t max_len_k = varlen ? longest_sequence(cu_k, max_seqlen_k, total_k) : total_k;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention", [&] {
    ForwardArgs<scalar_t> a = forward_tensors<scalar_t>(q, k, v, out, lse);
    a.q_layout = token_layout(q, varlen);
    a.out_layout = token_layout(out, varlen);
    a.k_layout.rows = token_layout(k, varlen);
    a.v_layout.rows = token_layout(v, varlen);
    a.lse_layout = lse_layout(lse, varlen);
    set_problem(a, shape, opts, cu_q, cu_k);
    a.max_len_q = max_len_q;
    const int64_t splits = choose_splits(a.batch, a.heads_q / a.group, a.group, max_len_q, max_len_k);
    [[maybe_unused]] const auto partials = set_splits(a, splits, max_len_k, q.options());
    launch_attention_forward(a);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& dlse, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, std::optional<int64_t> max_seqlen_q,
    std::optional<int64_t> max_seqlen_k) {
  const char* op = "attn_ops.attention_backward";
  const AttentionOptions opts = make_attention_options(scale, causal, window_left, window_right, softcap,
                                                       cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  const AttentionShape shape = check_attention_inputs(op, q, k, v, opts);
  check_attention_backward_inputs(op, shape, q, dout, out, lse, dlse);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  // lse, dlse and the delta scratch are read through one layout.
  const at::Tensor lse_c = lse.contiguous();
  const at::Tensor dlse_c = dlse.has_value() ? dlse->contiguous() : at::Tensor();
  at::Tensor delta = at::empty_like(lse_c);
  const bool varlen = shape.varlen;
  const int64_t total_q = shape.seqlen_q.expect_int(), total_k = shape.seqlen_k.expect_int();
  const at::Tensor cu_q = varlen ? cu_seqlens_q->contiguous() : at::Tensor();
  const at::Tensor cu_k = varlen ? cu_seqlens_k->contiguous() : at::Tensor();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention_backward", [&] {
    using A = acc_t<scalar_t>;
    BackwardArgs<scalar_t> a{};
    a.q = q.const_data_ptr<scalar_t>();
    a.k = k.const_data_ptr<scalar_t>();
    a.v = v.const_data_ptr<scalar_t>();
    a.out = out.const_data_ptr<scalar_t>();
    a.dout = dout.const_data_ptr<scalar_t>();
    a.lse = lse_c.const_data_ptr<A>();
    a.dlse = dlse_c.defined() ? dlse_c.const_data_ptr<A>() : nullptr;
    a.delta = delta.mutable_data_ptr<A>();
    a.dq = dq.mutable_data_ptr<scalar_t>();
    a.dk = dk.mutable_data_ptr<scalar_t>();
    a.dv = dv.mutable_data_ptr<scalar_t>();
    a.q_layout = token_layout(q, varlen);
    a.k_layout = token_layout(k, varlen);
    a.v_layout = token_layout(v, varlen);
    a.out_layout = token_layout(out, varlen);
    a.dout_layout = token_layout(dout, varlen);
    a.dq_layout = token_layout(dq, varlen);
    a.dk_layout = token_layout(dk, varlen);
    a.dv_layout = token_layout(dv, varlen);
    a.lse_layout = lse_layout(lse_c, varlen);
    set_problem(a, shape, opts, cu_q, cu_k);
    a.heads_kv = shape.heads_kv.expect_int();
    a.max_len_q = varlen ? longest_sequence(cu_q, max_seqlen_q, total_q) : total_q;
    a.max_len_k = varlen ? longest_sequence(cu_k, max_seqlen_k, total_k) : total_k;
    at::Tensor dq_accum;  // the tensor-core backward sums dQ over key tiles in fp32
    if (backward_uses_mma(a)) {
      dq_accum = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
      a.dq_accum = dq_accum.mutable_data_ptr<float>();
      a.dq_accum_layout = token_layout(dq_accum, varlen);
    }
    launch_attention_backward(a);
  });
  return {dq, dk, dv};
}

// [batch, capacity, heads, dim] rows, or [num_blocks, block_size, heads, dim] blocks through block_table.
KeyLayout cache_layout(const at::Tensor& cache, const at::Tensor& block_table) {
  KeyLayout l;
  l.rows = TokenLayout{cache.stride(0), cache.stride(1), cache.stride(2)};
  if (block_table.defined()) {
    l.block_table = block_table.const_data_ptr<int32_t>();
    l.table_stride = block_table.stride(0);
    l.table_width = block_table.size(1);
    l.block_stride = cache.stride(0);
    l.block_size = cache.size(1);
    l.num_blocks = cache.size(0);
  }
  return l;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> kvcache_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                                     const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                     const std::optional<at::Tensor>& block_table, double scale,
                                                     bool causal, int64_t window_left, int64_t window_right,
                                                     double softcap, const KvCacheRows& rows) {
  // Packed queries run on the varlen path of the kernels; row selection and left padding do not exist
  // there yet. mla_decode runs on this function too: the message names both ops.
  check_rows_not_given("attn_ops.attention_with_kvcache / attn_ops.mla_decode", "CUDA",
                       KvCacheRows{std::nullopt, std::nullopt, rows.cache_batch_idx, rows.cache_leftpad});
  const c10::cuda::CUDAGuard guard(q.device());
  const bool packed = rows.packed();
  const int64_t batch = cache_seqlens.size(0), heads_q = q.size(-2), tokens_q = packed ? q.size(0) : q.size(1);
  const int64_t dim_v = v_cache.size(3);
  at::Tensor out = packed ? at::empty({tokens_q, heads_q, dim_v}, q.options())
                          : at::empty({batch, tokens_q, heads_q, dim_v}, q.options());
  at::Tensor lse = at::empty(packed ? std::vector<int64_t>{heads_q, tokens_q} : std::vector<int64_t>{batch, heads_q, tokens_q},
                             q.options().dtype(attention_lse_dtype(q.scalar_type())));
  const at::Tensor lens = cache_seqlens.contiguous();
  const at::Tensor table = block_table.has_value() ? block_table->contiguous() : at::Tensor();
  const int64_t capacity = table.defined() ? table.size(1) * k_cache.size(1) : k_cache.size(1);
  // Packed: each row's queries start at cu_seqlens_q[b]. SeqInfo reads key offsets whenever it reads query
  // offsets; all-zero ones leave the keys to cache_seqlens (the cache rows are not packed).
  const at::Tensor cu_q = packed ? rows.cu_seqlens_q->contiguous() : at::Tensor();
  const at::Tensor cu_k = packed ? at::zeros({batch + 1}, cu_q.options()) : at::Tensor();
  const int64_t max_len_q = packed ? longest_sequence(cu_q, rows.max_seqlen_q, tokens_q) : tokens_q;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention_with_kvcache", [&] {
    using A = acc_t<scalar_t>;
    ForwardArgs<scalar_t> a = forward_tensors<scalar_t>(q, k_cache, v_cache, out, lse);
    a.q_layout = token_layout(q, packed);
    a.out_layout = token_layout(out, packed);
    a.k_layout = cache_layout(k_cache, table);
    a.v_layout = cache_layout(v_cache, table);
    a.lse_layout = lse_layout(lse, packed);
    // The queries are the last len_q of each row's cache_seqlens[b] keys.
    a.seqs = SeqInfo{packed ? cu_q.const_data_ptr<int32_t>() : nullptr,
                     packed ? cu_k.const_data_ptr<int32_t>() : nullptr, lens.const_data_ptr<int32_t>(), tokens_q,
                     capacity};
    a.window = make_window(window_left, causal ? 0 : window_right, capacity + max_len_q);
    a.logit = Logit<A>{static_cast<A>(scale), static_cast<A>(softcap)};
    a.batch = batch;
    a.heads_q = heads_q;
    a.group = heads_q / k_cache.size(2);
    a.dim_qk = q.size(-1);
    a.dim_v = dim_v;
    a.max_len_q = max_len_q;
    const int64_t splits = choose_splits(batch, k_cache.size(2), a.group, max_len_q, capacity);
    [[maybe_unused]] const auto partials = set_splits(a, splits, capacity, q.options());
    launch_attention_forward(a);
  });
  return {out, lse};
}

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("attention", &attention_cuda);
  m.impl("attention_backward", &attention_backward_cuda);
  m.impl("attention_with_kvcache", &attention_with_kvcache_on<kvcache_attention>);
}

}  // namespace attn_ops::cuda
