// Preparation of attention / attention_backward (argument checks, the default scale, the output shapes),
// shared by every backend, and the checks that every attention-like op shares (head counts and dims, score
// options).
#include "attention/validation.h"

#include "common/checks.h"
#include "common/index_checks.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

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

}  // namespace


void check_float_operands(const char* op, std::initializer_list<NamedTensor> operands) {
  const NamedTensor& first = *operands.begin();
  check_float_dtype(op, first.name, first.tensor);
  for (const NamedTensor& other : operands) {
    if (&other != &first) {
      check_same_dtype_device(op, other.name, other.tensor, first.name, first.tensor);
    }
  }
  for (const NamedTensor& operand : operands) {
    check_last_dim_contiguous(op, operand.name, operand.tensor);
  }
}

void check_head_dims(const char* op, const c10::SymInt& head_dim_qk, const c10::SymInt& head_dim_v) {
  TORCH_CHECK(head_dim_qk >= 1 && head_dim_v >= 1, op, ": head_dim_qk and head_dim_v must be at least 1, got ",
              head_dim_qk, " and ", head_dim_v);
  TORCH_CHECK(head_dim_qk <= kMaxHeadDim && head_dim_v <= kMaxHeadDim, op, ": head_dim_qk and head_dim_v must be at most ",
              kMaxHeadDim, ", got ", head_dim_qk, " and ", head_dim_v);
}

void check_head_counts(const char* op, const c10::SymInt& heads_q, const c10::SymInt& heads_kv) {
  TORCH_CHECK(heads_q >= 1 && heads_kv >= 1, op, ": heads_q and heads_kv must be at least 1, got heads_q ", heads_q,
              ", heads_kv ", heads_kv);
  TORCH_CHECK(heads_q % heads_kv == 0, op, ": heads_q (", heads_q, ") must be a multiple of heads_kv (", heads_kv,
              ")");
}

void check_score_options(const char* op, c10::ScalarType dtype, std::optional<double> scale, int64_t window_left,
                         int64_t window_right, double softcap) {
  TORCH_CHECK(window_left >= -1, op, ": window_left must be >= -1 (-1 means unbounded), got ", window_left);
  TORCH_CHECK(window_right >= -1, op, ": window_right must be >= -1 (-1 means unbounded), got ", window_right);
  const bool f64 = dtype == at::kDouble;
  const double largest = f64 ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
  const double smallest = f64 ? std::numeric_limits<double>::min() : std::numeric_limits<float>::min();
  const char* acc = f64 ? "float64" : "float32, the accumulation type of this input dtype";
  TORCH_CHECK(softcap == 0.0 || (softcap >= smallest && softcap <= largest), op,
              ": softcap must be 0 (disabled) or in [", smallest, ", ", largest, "] (representable in ", acc,
              "), got ", softcap);
  TORCH_CHECK(!scale.has_value() || std::abs(*scale) <= largest, op, ": scale must be finite with |scale| <= ",
              largest, " (representable in ", acc, "), got ", scale.value_or(0.0));
}

namespace {

// out: [batch, seqlen_q, heads_q, head_dim_v] or [total_q, heads_q, head_dim_v]; lse: [batch, heads_q,
// seqlen_q] or [heads_q, total_q].
OutLseSizes attention_outputs(const AttentionShape& s, c10::ScalarType dtype) {
  if (s.varlen) {
    return {{s.seqlen_q, s.heads_q, s.head_dim_v}, {s.heads_q, s.seqlen_q}, attention_lse_dtype(dtype)};
  }
  return {{s.batch, s.seqlen_q, s.heads_q, s.head_dim_v}, {s.batch, s.heads_q, s.seqlen_q}, attention_lse_dtype(dtype)};
}

AttentionShape check_attention_inputs(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const AttentionOptions& opts) {
  TORCH_CHECK(opts.cu_seqlens_q.has_value() == opts.cu_seqlens_k.has_value(), op,
              ": cu_seqlens_q and cu_seqlens_k must be given together, got only ",
              opts.cu_seqlens_q.has_value() ? "cu_seqlens_q" : "cu_seqlens_k");
  const bool varlen = opts.varlen();
  check_qkv_rank(op, "q", q, varlen, "[batch, seqlen_q, heads_q, head_dim_qk]", "[total_q, heads_q, head_dim_qk]");
  check_qkv_rank(op, "k", k, varlen, "[batch, seqlen_k, heads_kv, head_dim_qk]", "[total_k, heads_kv, head_dim_qk]");
  check_qkv_rank(op, "v", v, varlen, "[batch, seqlen_k, heads_kv, head_dim_v]", "[total_k, heads_kv, head_dim_v]");

  check_float_operands(op, {{"q", q}, {"k", k}, {"v", v}});

  AttentionShape s;
  s.varlen = varlen;
  const int64_t hd = varlen ? 1 : 2;  // index of the heads dim
  if (varlen) {
    const at::Tensor& cu_q = *opts.cu_seqlens_q;
    const at::Tensor& cu_k = *opts.cu_seqlens_k;
    check_cu_seqlens_meta(op, "cu_seqlens_q", cu_q, q);
    check_cu_seqlens_meta(op, "cu_seqlens_k", cu_k, q);
    TORCH_CHECK(cu_k.sym_size(0) == cu_q.sym_size(0), op, ": cu_seqlens_k must have the same length as cu_seqlens_q (",
                cu_q.sym_size(0), "), got ", cu_k.sym_size(0));
    s.batch = cu_q.sym_size(0) - 1;
    s.seqlen_q = q.sym_size(0);
    s.seqlen_k = k.sym_size(0);
    TORCH_CHECK(v.sym_size(0) == s.seqlen_k, op, ": v must have total_k ", s.seqlen_k, " (as k), got ", v.sym_size(0));
  } else {
    s.batch = q.sym_size(0);
    s.seqlen_q = q.sym_size(1);
    s.seqlen_k = k.sym_size(1);
    TORCH_CHECK(k.sym_size(0) == s.batch, op, ": k must have batch size ", s.batch, " (as q), got ", k.sym_size(0));
    TORCH_CHECK(v.sym_size(0) == s.batch, op, ": v must have batch size ", s.batch, " (as q), got ", v.sym_size(0));
    TORCH_CHECK(v.sym_size(1) == s.seqlen_k, op, ": v must have seqlen_k ", s.seqlen_k, " (as k), got ", v.sym_size(1));
  }
  TORCH_CHECK(!opts.max_seqlen_q.has_value() || varlen, op, ": max_seqlen_q must be given only with cu_seqlens_q");
  TORCH_CHECK(!opts.max_seqlen_k.has_value() || varlen, op, ": max_seqlen_k must be given only with cu_seqlens_k");

  s.heads_q = q.sym_size(hd);
  s.heads_kv = k.sym_size(hd);
  s.head_dim_qk = q.sym_size(hd + 1);
  s.head_dim_v = v.sym_size(hd + 1);
  TORCH_CHECK(v.sym_size(hd) == s.heads_kv, op, ": v must have heads_kv ", s.heads_kv, " (as k), got ", v.sym_size(hd));
  check_head_counts(op, s.heads_q, s.heads_kv);
  TORCH_CHECK(k.sym_size(hd + 1) == s.head_dim_qk, op, ": k must have head_dim_qk ", s.head_dim_qk, " (as q), got ",
              k.sym_size(hd + 1));
  check_head_dims(op, s.head_dim_qk, s.head_dim_v);

  check_score_options(op, q.scalar_type(), opts.scale, opts.window_left, opts.window_right, opts.softcap);
  TORCH_CHECK(!opts.max_seqlen_q.has_value() || *opts.max_seqlen_q >= 0, op, ": max_seqlen_q must be >= 0, got ",
              opts.max_seqlen_q.value_or(0));
  TORCH_CHECK(!opts.max_seqlen_k.has_value() || *opts.max_seqlen_k >= 0, op, ": max_seqlen_k must be >= 0, got ",
              opts.max_seqlen_k.value_or(0));

  // Values of cu_seqlens can only be read from real tensors, not while tracing with fake ones.
  if (varlen && can_read_values(q) && !q.sym_size(0).is_symbolic()) {
    const int64_t longest_q = check_cu_seqlens_values(op, "cu_seqlens_q", *opts.cu_seqlens_q,
                                                      s.seqlen_q.expect_int(), "q");
    const int64_t longest_k = check_cu_seqlens_values(op, "cu_seqlens_k", *opts.cu_seqlens_k,
                                                      s.seqlen_k.expect_int(), "k");
    check_max_seqlen(op, "max_seqlen_q", "cu_seqlens_q", opts.max_seqlen_q, longest_q);
    check_max_seqlen(op, "max_seqlen_k", "cu_seqlens_k", opts.max_seqlen_k, longest_k);
  }
  return s;
}

void check_attention_backward_inputs(const char* op, const AttentionShape& shape, const at::Tensor& q,
                                     const at::Tensor& dout, const at::Tensor& out, const at::Tensor& lse,
                                     const std::optional<at::Tensor>& dlse) {
  const OutLseSizes sizes = attention_outputs(shape, q.scalar_type());
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

c10::ScalarType attention_lse_dtype(c10::ScalarType input_dtype) {
  return input_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

double resolve_scale(std::optional<double> scale, const c10::SymInt& head_dim) {
  if (scale.has_value()) {
    return *scale;
  }
  return 1.0 / std::sqrt(static_cast<double>(head_dim.guard_int(__FILE__, __LINE__)));
}

std::tuple<at::Tensor, at::Tensor> empty_out_lse(const OutLseSizes& sizes, const at::TensorOptions& options) {
  return {at::empty_symint(sizes.out, options), at::empty_symint(sizes.lse, options.dtype(sizes.lse_dtype))};
}

AttentionPrep prepare_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                                const std::optional<at::Tensor>& cu_seqlens_k, std::optional<int64_t> max_seqlen_q,
                                std::optional<int64_t> max_seqlen_k) {
  AttentionPrep prep;
  prep.opts = AttentionOptions{scale,        causal,       window_left,  window_right, softcap,
                               cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  prep.shape = check_attention_inputs("attn_ops.attention", q, k, v, prep.opts);
  prep.outputs = attention_outputs(prep.shape, q.scalar_type());
  return prep;
}

AttentionPrep prepare_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                         const std::optional<at::Tensor>& dlse, std::optional<double> scale,
                                         bool causal, int64_t window_left, int64_t window_right, double softcap,
                                         const std::optional<at::Tensor>& cu_seqlens_q,
                                         const std::optional<at::Tensor>& cu_seqlens_k,
                                         std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k) {
  const char* op = "attn_ops.attention_backward";
  AttentionPrep prep;
  prep.opts = AttentionOptions{scale,        causal,       window_left,  window_right, softcap,
                               cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  prep.shape = check_attention_inputs(op, q, k, v, prep.opts);
  check_attention_backward_inputs(op, prep.shape, q, dout, out, lse, dlse);
  prep.outputs = attention_outputs(prep.shape, q.scalar_type());
  return prep;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_attention_grads(const at::Tensor& q, const at::Tensor& k,
                                                                     const at::Tensor& v) {
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options()),
          at::empty_symint(v.sym_sizes(), v.options())};
}

}  // namespace attn_ops
