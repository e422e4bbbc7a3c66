// Meta kernels of the additive attention ops: the shared preparation, then empty outputs of the right
// (symbolic) shapes, so fake tensors and torch.compile with dynamic shapes trace them.
#include "additive/validation.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace attn_ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> additive_attention_meta(
    const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w, const at::Tensor& v,
    const std::optional<at::Tensor>& key_padding_mask, bool return_weights) {
  const AdditiveProblem p = prepare_additive_attention(qp, kp, w, v, key_padding_mask);
  at::Tensor out = at::empty_symint({p.batch, p.query_len, p.value_dim}, qp.options());
  at::Tensor lse = at::empty_symint({p.batch, p.query_len}, qp.options().dtype(additive_lse_dtype(qp)));
  at::Tensor weights = return_weights ? at::empty_symint({p.batch, p.query_len, p.key_len}, qp.options())
                                      : at::empty({0}, qp.options());
  return {out, lse, weights};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> additive_attention_backward_meta(
    const at::Tensor& dout, const std::optional<at::Tensor>& dlse, const at::Tensor& qp, const at::Tensor& kp,
    const at::Tensor& w, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& key_padding_mask) {
  prepare_additive_attention_backward(dout, dlse, qp, kp, w, v, out, lse, key_padding_mask);
  return {at::empty_symint(qp.sym_sizes(), qp.options()), at::empty_symint(kp.sym_sizes(), kp.options()),
          at::empty_symint(w.sym_sizes(), w.options()), at::empty_symint(v.sym_sizes(), v.options())};
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("additive_attention", &additive_attention_meta);
  m.impl("additive_attention_backward", &additive_attention_backward_meta);
}

}  // namespace attn_ops
