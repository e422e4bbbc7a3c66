// CUDA backend of attention / attention_backward / attention_with_kvcache (and of mla_decode, which runs on
// attention_forward): the prepared call (preparation and output allocation in attention/entry.h) turned into
// the device-side problem description handed to the launchers (attention_launch.cu).
// Nothing here reads a tensor's values on the host except, for varlen without max_seqlen_q / max_seqlen_k,
// the longest sequences (one copy); the values of index tensors are checked on the device
// (common/cuda/index_checks.h).
#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/backend_route.h"
#include "attention/cuda/launch_record.h"
#include "attention/entry.h"
#include "common/attention_call.h"
#include "common/checks.h"
#include "common/cuda/index_checks.h"

#ifdef ATTN_OPS_WITH_CUDNN
#include "attention/cuda/cudnn_backend.h"
#endif

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

// The visible keys of a call: windows longer than `longest` are unbounded and chunks longer than it the same
// chunk of length longest + 1, which keeps the kernels' index arithmetic far from overflow.
Window make_window(const AttentionCall& call, int64_t longest) {
  const int64_t left = call.window_left, right = call.effective_window_right();
  return Window{left > longest ? -1 : left, right > longest ? -1 : right,
                std::min(call.patterns.attention_chunk, longest + 1)};
}

// Checks the values of cu_seqlens_q / cu_seqlens_k on the device (against max_seqlen_* when given) and
// returns the longest query and key sequences: the given max_seqlen_* (no sync), else read from the device,
// both in one copy (the one sync of a varlen call without them), else under graph capture, where nothing
// may be read, the packed totals, upper bounds.
std::pair<int64_t, int64_t> checked_longest_sequences(const AttentionCall& call, const at::Tensor& cu_q,
                                                      const at::Tensor& cu_k) {
  const char* op = call.op;
  const int64_t total_q = call.seqlen_q.expect_int(), total_k = call.seqlen_k.expect_int();
  check_cu_seqlens_on_device(op, "cu_seqlens_q", cu_q, total_q, "q", call.max_seqlen_q.value_or(-1), "max_seqlen_q");
  check_cu_seqlens_on_device(op, "cu_seqlens_k", cu_k, total_k, "k", call.max_seqlen_k.value_or(-1), "max_seqlen_k");
  const int64_t batch = cu_q.numel() - 1;
  if (batch < 1) {
    return {0, 0};
  }
  int64_t found_q = total_q, found_k = total_k;
  if (!(call.max_seqlen_q.has_value() && call.max_seqlen_k.has_value()) && device_checks_enabled()) {
    const auto longest = [&](const at::Tensor& cu) { return (cu.narrow(0, 1, batch) - cu.narrow(0, 0, batch)).max(); };
    const at::Tensor found = at::stack({longest(cu_q), longest(cu_k)}).to(at::kCPU);
    found_q = found.const_data_ptr<int32_t>()[0];
    found_k = found.const_data_ptr<int32_t>()[1];
  }
  return {std::min(call.max_seqlen_q.value_or(found_q), total_q), std::min(call.max_seqlen_k.value_or(found_k), total_k)};
}

// The longest row of packed queries over a cache (cu_seqlens_q, checked on the device by the caller):
// max_seqlen_q when given (no sync), else read in one copy, else under graph capture the total, an upper
// bound.
int64_t longest_packed_rows(const at::Tensor& cu_q, std::optional<int64_t> max_seqlen_q, int64_t total) {
  const int64_t batch = cu_q.numel() - 1;
  if (batch < 1) {
    return 0;
  }
  if (max_seqlen_q.has_value()) {
    return std::min(*max_seqlen_q, total);
  }
  if (!device_checks_enabled()) {
    return total;
  }
  return std::min((cu_q.narrow(0, 1, batch) - cu_q.narrow(0, 0, batch)).max().item<int64_t>(), total);
}

// Sets the split-KV plan of `a` (its sizes set) for rows of at most max_len_k keys (for a cache, its
// capacity: the lengths themselves stay on the device, where every row takes only the splits its own keys
// fill) and allocates the partial buffers when there is more than one split (kept alive by the returned
// tensors).
template <typename T>
std::pair<at::Tensor, at::Tensor> set_splits(ForwardArgs<T>& a, int64_t max_len_k, int64_t max_splits,
                                             const at::TensorOptions& options) {
  const int64_t heads_kv = a.heads_q / a.group, rows = a.max_len_q * a.group;
  a.split_min_keys = split_min_keys(rows, a.dim_qk, a.dim_v, static_cast<int64_t>(sizeof(T)));
  a.splits = max_key_splits(a.batch * heads_kv * ceil_div(rows, 64), sm_count(), max_len_k, a.split_min_keys);
  if (max_splits > 0) {  // num_splits
    a.splits = std::min(a.splits, max_splits);
  }
  if (a.splits == 1) {
    return {};
  }
  const auto acc = options.dtype(c10::CppTypeToScalarType<acc_type<T>>::value);
  at::Tensor out = at::empty({a.splits, a.batch, a.max_len_q, a.heads_q, a.dim_v}, acc);
  at::Tensor lse = at::empty({a.splits, a.batch, a.max_len_q, a.heads_q}, acc);
  a.partial_out = out.mutable_data_ptr<acc_type<T>>();
  a.partial_lse = lse.mutable_data_ptr<acc_type<T>>();
  return {out, lse};
}

// ForwardArgs with its tensors' data set (the rest left to the caller).
template <typename T>
ForwardArgs<T> forward_tensors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                               const at::Tensor& lse) {
  ForwardArgs<T> a{};
  a.q = q.const_data_ptr<T>();
  a.k = k.const_data_ptr<T>();
  a.v = v.const_data_ptr<T>();
  a.out = out.mutable_data_ptr<T>();
  a.lse = lse.mutable_data_ptr<acc_type<T>>();
  return a;
}

// The ALiBi slopes of a call ([heads_q] or [batch, heads_q] float32, read in place), or none.
Alibi make_alibi(const AttentionCall& call) {
  if (!call.patterns.alibi_slopes.has_value()) {
    return {};
  }
  const at::Tensor& slopes = *call.patterns.alibi_slopes;
  return Alibi{slopes.const_data_ptr<float>(), slopes.dim() == 2 ? slopes.stride(0) : 0, slopes.stride(-1)};
}

// The fields ForwardArgs and BackwardArgs share for attention / attention_backward: sequences (cu_q, cu_k:
// contiguous cu_seqlens, undefined when dense), window, logit, sizes.
template <typename Args>
void set_problem(Args& a, const AttentionCall& call, const at::Tensor& cu_q, const at::Tensor& cu_k) {
  using A = decltype(a.logit.scale);
  const int64_t total_q = call.seqlen_q.expect_int(), total_k = call.seqlen_k.expect_int();
  a.seqs = SeqInfo{cu_q.defined() ? cu_q.const_data_ptr<int32_t>() : nullptr,
                   cu_k.defined() ? cu_k.const_data_ptr<int32_t>() : nullptr, nullptr, total_q, total_k};
  a.window = make_window(call, std::max(total_q, total_k));
  a.logit = Logit<A>{static_cast<A>(call.scale()), static_cast<A>(call.softcap)};
  a.alibi = make_alibi(call);
  a.batch = call.batch.expect_int();
  a.heads_q = call.heads_q.expect_int();
  a.group = a.heads_q / call.heads_kv.expect_int();
  a.dim_qk = call.head_dim_qk.expect_int();
  a.dim_v = call.head_dim_v.expect_int();
}

// The forward over dense or varlen keys.
void sequences_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse) {
  const at::Tensor &q = call.q, &k = call.k, &v = call.v;
  const bool varlen = call.varlen();
  const int64_t total_q = call.seqlen_q.expect_int(), total_k = call.seqlen_k.expect_int();
  const at::Tensor cu_q = varlen ? call.cu_seqlens_q->contiguous() : at::Tensor();
  const at::Tensor cu_k = varlen ? call.cu_seqlens_k->contiguous() : at::Tensor();
  const std::pair<int64_t, int64_t> longest =
      varlen ? checked_longest_sequences(call, cu_q, cu_k) : std::pair{total_q, total_k};
  const int64_t max_len_q = longest.first, max_len_k = longest.second;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention_forward", [&] {
    ForwardArgs<scalar_t> a = forward_tensors<scalar_t>(q, k, v, out, lse);
    a.q_layout = token_layout(q, varlen);
    a.out_layout = token_layout(out, varlen);
    a.k_layout.rows = token_layout(k, varlen);
    a.v_layout.rows = token_layout(v, varlen);
    a.lse_layout = lse_layout(lse, varlen);
    set_problem(a, call, cu_q, cu_k);
    a.max_len_q = max_len_q;
    [[maybe_unused]] const auto partials = set_splits(a, max_len_k, call.num_splits, q.options());
    launch_attention_forward(a);
  });
}

// Where a call runs (attention/cuda/backend_route.h), recorded for _cuda_last_route: true when cuDNN ran it
// (`run_cudnn(&why)`), false when attn_ops' kernels must (the router's reason, or why cuDNN had no plan).
template <typename Decide, typename RunCudnn>
bool ran_on_cudnn(const char* stage, const char* op, const Decide& decide, const RunCudnn& run_cudnn) {
#ifdef ATTN_OPS_WITH_CUDNN
  const CudnnFacts facts = cudnn_facts();
#else
  const CudnnFacts facts{};
#endif
  const BackendRequest request = backend_request();
  RouteDecision route = apply_request(decide(facts), request, op);
  if (route.backend == AttentionBackend::cudnn) {
    std::string why;
    if (run_cudnn(&why)) {
      record_route(stage, "cudnn: " + route.reason);
      return true;
    }
    TORCH_CHECK(request != BackendRequest::cudnn, op, ": ATTN_OPS_ATTENTION_BACKEND=cudnn, but ", why);
    route = RouteDecision{AttentionBackend::native, why};
  }
  record_route(stage, "native: " + route.reason);
  return false;
}

void attention_backward_cuda(const AttentionBackwardCall& call, const at::Tensor& dq, const at::Tensor& dk,
                             const at::Tensor& dv) {
  const at::Tensor &q = call.q, &k = call.k, &v = call.v, &out = call.out, &dout = call.dout;
  const c10::cuda::CUDAGuard guard(q.device());
  const auto decide = [&](const CudnnFacts& facts) { return route_backward(call, facts); };
  const auto run_cudnn = [&](std::string* why) {
#ifdef ATTN_OPS_WITH_CUDNN
    return cudnn_attention_backward(call, dq, dk, dv, why);
#else
    (void)why;
    return false;  // never asked: without the backend the router keeps every call native
#endif
  };
  if (ran_on_cudnn("backward", call.op, decide, run_cudnn)) {
    return;
  }
  // lse, dlse and the delta scratch are read through one layout.
  const at::Tensor lse_c = call.lse.contiguous();
  const at::Tensor dlse_c = call.dlse.has_value() ? call.dlse->contiguous() : at::Tensor();
  at::Tensor delta = at::empty_like(lse_c);
  const bool varlen = call.varlen();
  const int64_t total_q = call.seqlen_q.expect_int(), total_k = call.seqlen_k.expect_int();
  const at::Tensor cu_q = varlen ? call.cu_seqlens_q->contiguous() : at::Tensor();
  const at::Tensor cu_k = varlen ? call.cu_seqlens_k->contiguous() : at::Tensor();
  const std::pair<int64_t, int64_t> longest =
      varlen ? checked_longest_sequences(call, cu_q, cu_k) : std::pair{total_q, total_k};

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention_backward", [&] {
    using A = acc_type<scalar_t>;
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
    set_problem(a, call, cu_q, cu_k);
    a.deterministic = call.deterministic;
    a.heads_kv = call.heads_kv.expect_int();
    a.max_len_q = longest.first;
    a.max_len_k = longest.second;
    // The tensor-core backward sums dQ over key tiles in fp32, and dK / dV over query-head splits.
    at::Tensor dq_accum, dk_accum, dv_accum;
    if (backward_uses_mma(a)) {
      const auto fp32 = q.options().dtype(at::kFloat);
      dq_accum = at::zeros(q.sizes(), fp32);
      a.dq_accum = dq_accum.mutable_data_ptr<float>();
      a.dq_accum_layout = token_layout(dq_accum, varlen);
      a.head_splits = query_head_splits(ceil_div(a.max_len_k, kBackwardKeyTile) * a.heads_kv * a.batch, a.group,
                                        sm_count());
      a.heads_per_split = ceil_div(a.group, a.head_splits);
      if (a.head_splits > 1) {
        dk_accum = at::zeros(k.sizes(), fp32);
        dv_accum = at::zeros(v.sizes(), fp32);
        a.dk_accum = dk_accum.mutable_data_ptr<float>();
        a.dv_accum = dv_accum.mutable_data_ptr<float>();
        a.dk_accum_layout = token_layout(dk_accum, varlen);
        a.dv_accum_layout = token_layout(dv_accum, varlen);
      }
    }
    launch_attention_backward(a);
  });
}

// [rows, capacity, heads, dim] rows, or [num_blocks, block_size, heads, dim] blocks through block_table;
// with cache_row (contiguous cache_batch_idx, else undefined) sequence b reads row cache_row[b].
KeyLayout cache_layout(const at::Tensor& cache, const at::Tensor& block_table, const at::Tensor& cache_row) {
  KeyLayout l;
  l.rows = TokenLayout{cache.stride(0), cache.stride(1), cache.stride(2)};
  if (cache_row.defined()) {
    l.cache_row = cache_row.const_data_ptr<int32_t>();
    l.num_rows = block_table.defined() ? block_table.size(0) : cache.size(0);
  }
  if (block_table.defined()) {
    l.block_table = block_table.const_data_ptr<int32_t>();
    l.table_stride = block_table.stride(0);
    l.table_width = block_table.size(1);
    l.block_stride = cache.stride(0);
    l.block_size = cache.size(1);
    l.num_blocks = cache.size(0);
    if (l.block_size > 0 && (l.block_size & (l.block_size - 1)) == 0) {
      l.block_shift = __builtin_ctzll(static_cast<unsigned long long>(l.block_size));
    }
  }
  return l;
}

// On the device, in the host validation's order: cu_seqlens_q against q's token count and max_seqlen_q (packed
// queries), cache_batch_idx in [0, rows of the block table or of the cache), cache_leftpad in
// [0, cache_seqlens[b]], cache_seqlens in [0, capacity] and, paged, the block-table entries of the used blocks
// in [0, num_blocks).
void check_cache_values_on_device(const AttentionCall& call) {
  const char* op = call.op;
  const at::Tensor& cache = call.k;
  const at::Tensor& lens = *call.cache_seqlens;
  if (call.packed_q()) {  // packed queries: [total_q, heads, dim]
    check_cu_seqlens_on_device(op, "cu_seqlens_q", *call.cu_seqlens_q, call.q.size(0), "q",
                               call.max_seqlen_q.value_or(-1), "max_seqlen_q");
  }
  const bool paged = call.paged();
  const at::Tensor table_rows = call.cache_batch_idx.value_or(at::Tensor());
  const at::Tensor first_key = call.cache_leftpad.value_or(at::Tensor());
  if (table_rows.defined()) {
    check_batch_idx_on_device(op, table_rows, paged ? call.block_table->size(0) : cache.size(0),
                              paged ? "block_table" : call.cache_name, /*distinct=*/false);
  }
  if (first_key.defined()) {
    check_leftpad_on_device(op, first_key, lens);
  }
  if (paged) {
    check_cache_lengths_and_blocks_on_device(op, lens, *call.block_table, call.seqlen_k.expect_int(), cache.size(1),
                                             cache.size(0), table_rows, first_key);
  } else {
    check_cache_lengths_and_blocks_on_device(op, lens, at::Tensor(), cache.size(1), 0, 0);
  }
}

// The forward over a contiguous or paged cache: row b reads the keys cache_leftpad[b] (else 0) ..
// cache_seqlens[b] - 1 of cache (or block-table) row cache_batch_idx[b] (else b); its queries are the last
// len_q of them.
void cache_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse) {
  const at::Tensor &q = call.q, &k_cache = call.k, &v_cache = call.v;
  const bool packed = call.packed_q();
  const int64_t batch = call.batch.expect_int(), tokens_q = call.seqlen_q.expect_int();
  const int64_t capacity = call.seqlen_k.expect_int();
  const at::Tensor lens = call.cache_seqlens->contiguous();
  const at::Tensor table = call.paged() ? call.block_table->contiguous() : at::Tensor();
  // Packed: each row's queries start at cu_seqlens_q[b]. SeqInfo reads key offsets whenever it reads query
  // offsets; all-zero ones leave the keys to cache_seqlens (the cache rows are not packed).
  const at::Tensor cu_q = packed ? call.cu_seqlens_q->contiguous() : at::Tensor();
  const at::Tensor cu_k = packed ? at::zeros({batch + 1}, cu_q.options()) : at::Tensor();
  const int64_t max_len_q = packed ? longest_packed_rows(cu_q, call.max_seqlen_q, tokens_q) : tokens_q;
  const at::Tensor cache_row = call.cache_batch_idx.has_value() ? call.cache_batch_idx->contiguous() : at::Tensor();
  const at::Tensor first_key = call.cache_leftpad.has_value() ? call.cache_leftpad->contiguous() : at::Tensor();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attn_ops.attention_forward", [&] {
    using A = acc_type<scalar_t>;
    ForwardArgs<scalar_t> a = forward_tensors<scalar_t>(q, k_cache, v_cache, out, lse);
    a.q_layout = token_layout(q, packed);
    a.out_layout = token_layout(out, packed);
    a.k_layout = cache_layout(k_cache, table, cache_row);
    a.v_layout = cache_layout(v_cache, table, cache_row);
    a.lse_layout = lse_layout(lse, packed);
    a.seqs = SeqInfo{packed ? cu_q.const_data_ptr<int32_t>() : nullptr,
                     packed ? cu_k.const_data_ptr<int32_t>() : nullptr, lens.const_data_ptr<int32_t>(), tokens_q,
                     capacity, first_key.defined() ? first_key.const_data_ptr<int32_t>() : nullptr};
    a.window = make_window(call, capacity + max_len_q);
    a.logit = Logit<A>{static_cast<A>(call.scale()), static_cast<A>(call.softcap)};
    a.alibi = make_alibi(call);
    a.batch = batch;
    a.heads_q = call.heads_q.expect_int();
    a.group = a.heads_q / call.heads_kv.expect_int();
    a.dim_qk = call.head_dim_qk.expect_int();
    a.dim_v = call.head_dim_v.expect_int();
    a.max_len_q = max_len_q;
    [[maybe_unused]] const auto partials = set_splits(a, capacity, call.num_splits, q.options());
    launch_attention_forward(a);
  });
}

// Adds the sink logits to finished rows, out of the kernels: each row's denominator gains exp(sinks[h]), so
// out scales by exp(lse - lse') with lse' = logaddexp(lse, sinks[h]); a row with no key keeps out 0, lse' =
// sinks[h]. out [.., Hq, Dv] (any leading dims), lse [B, Hq, Tq] or packed [Hq, total_q].
void add_sinks(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse) {
  const at::Tensor logit = call.patterns.sinks->to(lse.scalar_type());
  const at::Tensor sink = call.packed_q() ? logit.unsqueeze(1) : logit.view({1, -1, 1});
  const at::Tensor merged = at::logaddexp(lse, sink);
  const at::Tensor factor = at::where(at::isneginf(lse), at::zeros_like(lse), at::exp(lse - merged));
  // factor as out's [.., Hq] rows: lse's [B, Hq, Tq] -> [B, Tq, Hq]; [Hq, total_q] -> [total_q, Hq].
  const at::Tensor rows = call.packed_q() ? factor.t() : factor.transpose(1, 2);
  out.copy_(out.to(lse.scalar_type()) * rows.unsqueeze(-1));
  lse.copy_(merged);
}

}  // namespace

void attention_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse) {
  // Before the first check kernel: it must run on q's device and see that device's capture state.
  check_backend_reads_cache(call.op, {call.cache_name, call.k}, "CUDA");
  const c10::cuda::CUDAGuard guard(call.q.device());
  if (call.over_cache()) {
    check_cache_values_on_device(call);  // whichever backend runs
  }
  const auto decide = [&](const CudnnFacts& facts) { return route_forward(call, facts); };
  const auto run_cudnn = [&](std::string* why) {
#ifdef ATTN_OPS_WITH_CUDNN
    return cudnn_attention_forward(call, out, lse, why);
#else
    (void)why;
    return false;  // never asked: without the backend the router keeps every call native
#endif
  };
  if (!ran_on_cudnn("forward", call.op, decide, run_cudnn)) {
    if (call.over_cache()) {
      cache_forward(call, out, lse);
    } else {
      sequences_forward(call, out, lse);
    }
  }
  if (call.patterns.sinks.has_value()) {
    add_sinks(call, out, lse);
  }
}

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("attention", &attention_on<attention_forward>);
  m.impl("attention_backward", &attention_backward_on<attention_backward_cuda>);
  m.impl("attention_with_kvcache", &attention_with_kvcache_on<attention_forward>);
}

}  // namespace attn_ops::cuda
