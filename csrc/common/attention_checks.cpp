// The checks and output rules shared by every attention-like family (common/attention_checks.h).
#include "common/attention_checks.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <limits>

namespace attn_ops {

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

void check_pattern_options(const char* op, const at::Tensor& q, const c10::SymInt& batch,
                           const c10::SymInt& heads_q, const PatternOptions& patterns) {
  TORCH_CHECK(patterns.attention_chunk >= 0, op, ": attention_chunk must be >= 0 (0 disables chunking), got ",
              patterns.attention_chunk);
  if (patterns.sinks.has_value()) {
    const at::Tensor& s = *patterns.sinks;
    TORCH_CHECK(s.dim() == 1 && s.sym_size(0) == heads_q, op, ": sinks must have shape [", heads_q,
                "] (one logit per query head), got ", shape_str(s));
    TORCH_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == q.scalar_type(), op,
                ": sinks must be float32 or q's dtype (", dtype_name(q.scalar_type()), "), got ",
                dtype_name(s.scalar_type()));
    check_same_device(op, "sinks", s, "q", q);
  }
  if (patterns.alibi_slopes.has_value()) {
    const at::Tensor& a = *patterns.alibi_slopes;
    const bool per_head = a.dim() == 1 && a.sym_size(0) == heads_q;
    const bool per_sequence = a.dim() == 2 && a.sym_size(0) == batch && a.sym_size(1) == heads_q;
    TORCH_CHECK(per_head || per_sequence, op, ": alibi_slopes must have shape [", heads_q, "] or [", batch, ", ",
                heads_q, "] (one slope per query head, or per sequence and query head), got ", shape_str(a));
    TORCH_CHECK(a.scalar_type() == at::kFloat, op, ": alibi_slopes must be float32, got ",
                dtype_name(a.scalar_type()));
    check_same_device(op, "alibi_slopes", a, "q", q);
    check_alibi_not_differentiable(op, patterns.alibi_slopes);
  }
}

void check_alibi_not_differentiable(const char* op, const std::optional<at::Tensor>& alibi_slopes) {
  TORCH_CHECK(!(alibi_slopes.has_value() && alibi_slopes->requires_grad() && at::GradMode::is_enabled()), op,
              ": alibi_slopes is not differentiable but requires grad; pass alibi_slopes.detach()");
}

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

}  // namespace attn_ops
