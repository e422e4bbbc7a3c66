// Preparation of attention / attention_backward (argument checks, the output shapes) into the AttentionCall
// every backend takes.
#include "attention/validation.h"

#include "common/attention_checks.h"
#include "common/checks.h"
#include "common/index_checks.h"

#include <ATen/ATen.h>

namespace attn_ops {
namespace {

// The rank and the names of the dimensions expected of q, k or v.
void check_qkv_rank(const char* op, const char* name, const at::Tensor& t, bool varlen, const char* dense_dims,
                    const char* varlen_dims) {
  if (varlen) {
    check_rank(op, name, t, 3, varlen_dims, " when cu_seqlens_q is given");
  } else {
    check_rank(op, name, t, 4, dense_dims);
  }
}

void check_cu_seqlens_meta(const char* op, const char* name, const at::Tensor& cu, const at::Tensor& q) {
  TORCH_CHECK(cu.scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", dtype_name(cu.scalar_type()));
  TORCH_CHECK(cu.dim() == 1 && cu.sym_size(0) >= 1, op, ": ", name,
              " must be a 1-D tensor of length batch + 1 >= 1, got shape ", shape_str(cu));
  check_same_device(op, name, cu, "q", q);
}

// out: [batch, seqlen_q, heads_q, head_dim_v] or [total_q, heads_q, head_dim_v]; lse: [batch, heads_q,
// seqlen_q] or [heads_q, total_q].
OutLseSizes attention_outputs(const AttentionCall& s, c10::ScalarType dtype) {
  if (s.varlen()) {
    return {{s.seqlen_q, s.heads_q, s.head_dim_v}, {s.heads_q, s.seqlen_q}, attention_lse_dtype(dtype)};
  }
  return {{s.batch, s.seqlen_q, s.heads_q, s.head_dim_v}, {s.batch, s.heads_q, s.seqlen_q}, attention_lse_dtype(dtype)};
}

// The operands and options of attention / attention_backward, as given.
void set_operands(AttentionCall& call, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
                  const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                  std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k) {
  call.q = q;
  call.k = k;
  call.v = v;
  call.given_scale = scale;
  call.causal = causal;
  call.window_left = window_left;
  call.window_right = window_right;
  call.softcap = softcap;
  call.cu_seqlens_q = cu_seqlens_q;
  call.cu_seqlens_k = cu_seqlens_k;
  call.max_seqlen_q = max_seqlen_q;
  call.max_seqlen_k = max_seqlen_k;
}

// Checks q, k, v and the options of `call` (its op, operands and options set) and sets its key source, sizes
// and output shapes.
void check_attention_inputs(AttentionCall& call) {
  const char* op = call.op;
  const at::Tensor &q = call.q, &k = call.k, &v = call.v;
  TORCH_CHECK(call.cu_seqlens_q.has_value() == call.cu_seqlens_k.has_value(), op,
              ": cu_seqlens_q and cu_seqlens_k must be given together, got only ",
              call.cu_seqlens_q.has_value() ? "cu_seqlens_q" : "cu_seqlens_k");
  const bool varlen = call.cu_seqlens_q.has_value();
  call.keys = varlen ? KeySource::varlen : KeySource::dense;
  check_qkv_rank(op, "q", q, varlen, "[batch, seqlen_q, heads_q, head_dim_qk]", "[total_q, heads_q, head_dim_qk]");
  check_qkv_rank(op, "k", k, varlen, "[batch, seqlen_k, heads_kv, head_dim_qk]", "[total_k, heads_kv, head_dim_qk]");
  check_qkv_rank(op, "v", v, varlen, "[batch, seqlen_k, heads_kv, head_dim_v]", "[total_k, heads_kv, head_dim_v]");

  check_float_operands(op, {{"q", q}, {"k", k}, {"v", v}});

  const int64_t hd = varlen ? 1 : 2;  // index of the heads dim
  if (varlen) {
    const at::Tensor& cu_q = *call.cu_seqlens_q;
    const at::Tensor& cu_k = *call.cu_seqlens_k;
    check_cu_seqlens_meta(op, "cu_seqlens_q", cu_q, q);
    check_cu_seqlens_meta(op, "cu_seqlens_k", cu_k, q);
    TORCH_CHECK(cu_k.sym_size(0) == cu_q.sym_size(0), op, ": cu_seqlens_k must have the same length as cu_seqlens_q (",
                cu_q.sym_size(0), "), got ", cu_k.sym_size(0));
    call.batch = cu_q.sym_size(0) - 1;
    call.seqlen_q = q.sym_size(0);
    call.seqlen_k = k.sym_size(0);
    TORCH_CHECK(v.sym_size(0) == call.seqlen_k, op, ": v must have total_k ", call.seqlen_k, " (as k), got ", v.sym_size(0));
  } else {
    call.batch = q.sym_size(0);
    call.seqlen_q = q.sym_size(1);
    call.seqlen_k = k.sym_size(1);
    TORCH_CHECK(k.sym_size(0) == call.batch, op, ": k must have batch size ", call.batch, " (as q), got ", k.sym_size(0));
    TORCH_CHECK(v.sym_size(0) == call.batch, op, ": v must have batch size ", call.batch, " (as q), got ", v.sym_size(0));
    TORCH_CHECK(v.sym_size(1) == call.seqlen_k, op, ": v must have seqlen_k ", call.seqlen_k, " (as k), got ", v.sym_size(1));
  }
  TORCH_CHECK(!call.max_seqlen_q.has_value() || varlen, op, ": max_seqlen_q must be given only with cu_seqlens_q");
  TORCH_CHECK(!call.max_seqlen_k.has_value() || varlen, op, ": max_seqlen_k must be given only with cu_seqlens_k");

  call.heads_q = q.sym_size(hd);
  call.heads_kv = k.sym_size(hd);
  call.head_dim_qk = q.sym_size(hd + 1);
  call.head_dim_v = v.sym_size(hd + 1);
  TORCH_CHECK(v.sym_size(hd) == call.heads_kv, op, ": v must have heads_kv ", call.heads_kv, " (as k), got ", v.sym_size(hd));
  check_head_counts(op, call.heads_q, call.heads_kv);
  TORCH_CHECK(k.sym_size(hd + 1) == call.head_dim_qk, op, ": k must have head_dim_qk ", call.head_dim_qk, " (as q), got ",
              k.sym_size(hd + 1));
  check_head_dims(op, call.head_dim_qk, call.head_dim_v);

  check_score_options(op, q.scalar_type(), call.given_scale, call.window_left, call.window_right, call.softcap);
  check_pattern_options(op, q, call.batch, call.heads_q, call.patterns);
  TORCH_CHECK(!call.max_seqlen_q.has_value() || *call.max_seqlen_q >= 0, op, ": max_seqlen_q must be >= 0, got ",
              call.max_seqlen_q.value_or(0));
  TORCH_CHECK(!call.max_seqlen_k.has_value() || *call.max_seqlen_k >= 0, op, ": max_seqlen_k must be >= 0, got ",
              call.max_seqlen_k.value_or(0));

  // Values of cu_seqlens can only be read from real tensors, not while tracing with fake ones.
  if (varlen && can_read_values(q) && !q.sym_size(0).is_symbolic()) {
    const int64_t longest_q = check_cu_seqlens_values(op, "cu_seqlens_q", *call.cu_seqlens_q,
                                                      call.seqlen_q.expect_int(), "q");
    const int64_t longest_k = check_cu_seqlens_values(op, "cu_seqlens_k", *call.cu_seqlens_k,
                                                      call.seqlen_k.expect_int(), "k");
    check_max_seqlen(op, "max_seqlen_q", "cu_seqlens_q", call.max_seqlen_q, longest_q);
    check_max_seqlen(op, "max_seqlen_k", "cu_seqlens_k", call.max_seqlen_k, longest_k);
  }
  call.outputs = attention_outputs(call, q.scalar_type());
}

void check_attention_backward_inputs(const AttentionBackwardCall& call) {
  const char* op = call.op;
  const at::Tensor &q = call.q, &dout = call.dout, &out = call.out, &lse = call.lse;
  const std::optional<at::Tensor>& dlse = call.dlse;
  const OutLseSizes& sizes = call.outputs;
  const std::vector<c10::SymInt>& out_shape = sizes.out;
  const std::vector<c10::SymInt>& lse_shape = sizes.lse;
  const c10::ScalarType lse_dtype = sizes.lse_dtype;
  TORCH_CHECK(out.sym_sizes() == c10::SymIntArrayRef(out_shape), op, ": out must have shape ", shape_str(out_shape),
              ", got ", shape_str(out));
  TORCH_CHECK(dout.sym_sizes() == out.sym_sizes(), op, ": dout must have shape ", shape_str(out_shape),
              " (as out), got ", shape_str(dout));
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"dout", dout}, {"out", out}}) {
    check_same_dtype_device(op, name, t, "q", q);
    check_last_dim_contiguous(op, name, t);
  }
  auto check_lse_like = [&](const char* name, const at::Tensor& t) {
    TORCH_CHECK(t.sym_sizes() == c10::SymIntArrayRef(lse_shape) && t.scalar_type() == lse_dtype, op, ": ", name,
                " must have shape ", shape_str(lse_shape), " and dtype ", dtype_name(lse_dtype), ", got shape ",
                shape_str(t), " and dtype ", dtype_name(t.scalar_type()));
    check_same_device(op, name, t, "q", q);
  };
  check_lse_like("lse", lse);
  if (dlse.has_value()) {
    check_lse_like("dlse", *dlse);
  }
}

}  // namespace

AttentionCall prepare_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                                const std::optional<at::Tensor>& cu_seqlens_k, std::optional<int64_t> max_seqlen_q,
                                std::optional<int64_t> max_seqlen_k, const PatternOptions& patterns) {
  AttentionCall call;
  call.op = "attn_ops.attention";
  set_operands(call, q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k,
               max_seqlen_q, max_seqlen_k);
  call.patterns = patterns;
  check_attention_inputs(call);
  return call;
}

AttentionBackwardCall prepare_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                 const std::optional<at::Tensor>& dlse, std::optional<double> scale,
                                                 bool causal, int64_t window_left, int64_t window_right,
                                                 double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                                                 const std::optional<at::Tensor>& cu_seqlens_k,
                                                 std::optional<int64_t> max_seqlen_q,
                                                 std::optional<int64_t> max_seqlen_k, const PatternOptions& patterns,
                                                 bool deterministic) {
  AttentionBackwardCall call;
  call.op = "attn_ops.attention_backward";
  set_operands(call, q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k,
               max_seqlen_q, max_seqlen_k);
  call.dout = dout;
  call.out = out;
  call.lse = lse;
  call.dlse = dlse;
  call.patterns = patterns;
  call.deterministic = deterministic || at::globalContext().deterministicAlgorithms();
  check_attention_inputs(call);
  check_attention_backward_inputs(call);
  return call;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_attention_grads(const at::Tensor& q, const at::Tensor& k,
                                                                     const at::Tensor& v) {
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options()),
          at::empty_symint(v.sym_sizes(), v.options())};
}

}  // namespace attn_ops
