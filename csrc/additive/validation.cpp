// Argument preparation of the additive attention ops (see validation.h); the messages are listed in
// docs/additive_api.md.
#include "additive/validation.h"

#include "common/checks.h"

namespace attn_ops {
namespace {

// `t` has size `expected` (named `what`) in dimension `dim` ("batch", "key_len", ...).
void check_size(const char* op, const char* name, const at::Tensor& t, int64_t dim, const char* dim_name,
                const c10::SymInt& expected, const char* source) {
  TORCH_CHECK(t.sym_size(dim) == expected, op, ": ", name, " must have ", dim_name, " = ", expected, " (as ", source,
              "), got shape ", shape_str(t));
}

}  // namespace

AdditiveProblem prepare_additive_attention(const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w,
                                           const at::Tensor& v, const std::optional<at::Tensor>& key_padding_mask) {
  constexpr const char* op = "attn_ops.additive_attention";
  check_float_dtype(op, "qp", qp);
  check_rank(op, "qp", qp, 3, "[batch, query_len, hidden]");
  check_rank(op, "kp", kp, 3, "[batch, key_len, hidden]");
  check_rank(op, "w", w, 1, "[hidden]");
  check_rank(op, "v", v, 3, "[batch, key_len, value_dim]");
  check_same_dtype_device(op, "kp", kp, "qp", qp);
  check_same_dtype_device(op, "w", w, "qp", qp);
  check_same_dtype_device(op, "v", v, "qp", qp);
  const AdditiveProblem p{qp.sym_size(0), qp.sym_size(1), kp.sym_size(1), qp.sym_size(2), v.sym_size(2)};
  check_size(op, "kp", kp, 0, "batch", p.batch, "qp");
  check_size(op, "kp", kp, 2, "hidden", p.hidden, "qp");
  check_size(op, "w", w, 0, "hidden", p.hidden, "qp");
  check_size(op, "v", v, 0, "batch", p.batch, "qp");
  check_size(op, "v", v, 1, "key_len", p.key_len, "kp");
  if (key_padding_mask.has_value()) {
    const at::Tensor& mask = *key_padding_mask;
    TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 2 && mask.sym_size(0) == p.batch &&
                    mask.sym_size(1) == p.key_len,
                op, ": key_padding_mask must be a bool tensor of shape [", p.batch, ", ", p.key_len,
                "] [batch, key_len], got ", dtype_name(mask.scalar_type()), " tensor of shape ", shape_str(mask));
    check_same_device(op, "key_padding_mask", mask, "qp", qp);
  }
  return p;
}

AdditiveProblem prepare_additive_attention_backward(const at::Tensor& dout, const std::optional<at::Tensor>& dlse,
                                                    const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w,
                                                    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                    const std::optional<at::Tensor>& key_padding_mask) {
  constexpr const char* op = "attn_ops.additive_attention_backward";
  const AdditiveProblem p = prepare_additive_attention(qp, kp, w, v, key_padding_mask);
  const c10::ScalarType lse_dtype = additive_lse_dtype(qp);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"dout", dout}, {"out", out}}) {
    TORCH_CHECK(t.dim() == 3 && t.sym_size(0) == p.batch && t.sym_size(1) == p.query_len &&
                    t.sym_size(2) == p.value_dim,
                op, ": ", name, " must be a tensor of shape [", p.batch, ", ", p.query_len, ", ", p.value_dim,
                "] [batch, query_len, value_dim], got shape ", shape_str(t));
    check_same_dtype_device(op, name, t, "qp", qp);
  }
  std::vector<std::pair<const char*, const at::Tensor*>> stats{{"lse", &lse}};
  if (dlse.has_value()) {
    stats.emplace_back("dlse", &*dlse);
  }
  for (const auto& [name, t] : stats) {
    TORCH_CHECK(t->scalar_type() == lse_dtype && t->dim() == 2 && t->sym_size(0) == p.batch &&
                    t->sym_size(1) == p.query_len,
                op, ": ", name, " must be a ", dtype_name(lse_dtype), " tensor of shape [", p.batch, ", ",
                p.query_len, "] [batch, query_len], got ", dtype_name(t->scalar_type()), " tensor of shape ",
                shape_str(*t));
    check_same_device(op, name, *t, "qp", qp);
  }
  return p;
}

}  // namespace attn_ops
