// Autograd of additive_attention, registered in C++ at the Autograd key so LibTorch programs get
// gradients too. The backward is its own operator (additive_attention_backward). Gradients flow
// through out and lse; the optional weights output is for inspection and is not differentiable.
#include "attn_ops.h"  // the public C++ API

#include <torch/autograd.h>
#include <torch/library.h>

namespace attn_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class AdditiveAttentionFunction : public torch::autograd::Function<AdditiveAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w,
                               const at::Tensor& v, const std::optional<at::Tensor>& key_padding_mask,
                               bool return_weights) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse, weights] = attn_ops::additive_attention(qp, kp, w, v, key_padding_mask, return_weights);
    ctx->save_for_backward({qp, kp, w, v, out, lse, key_padding_mask.value_or(at::Tensor())});
    ctx->mark_non_differentiable({weights});
    return {out, lse, weights};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &out = saved[4], &mask = saved[6];
    // An unused out contributes no gradient; an expanded incoming gradient (out.sum()) is made dense.
    const at::Tensor dout = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(out);
    const std::optional<at::Tensor> dlse = grads[1].defined() ? std::optional<at::Tensor>(grads[1]) : std::nullopt;
    auto [dqp, dkp, dw, dv] = attn_ops::additive_attention_backward(
        dout, dlse, saved[0], saved[1], saved[2], saved[3], out, saved[5],
        mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt);
    return {dqp, dkp, dw, dv, at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> additive_attention_autograd(
    const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w, const at::Tensor& v,
    const std::optional<at::Tensor>& key_padding_mask, bool return_weights) {
  variable_list outs = AdditiveAttentionFunction::apply(qp, kp, w, v, key_padding_mask, return_weights);
  return {outs[0], outs[1], outs[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Autograd, m) {
  m.impl("additive_attention", &additive_attention_autograd);
}

}  // namespace attn_ops
