// Autograd of lightning_attention at the Autograd key (so LibTorch C++ programs get gradients too), calling
// the ops through the C++ API (attn_ops.h):
// gradients for q, k, v and initial_state through lightning_attention_backward. slope gets none: it is a
// fixed buffer in every model that uses this form (MiniMax-Text-01), see docs/lightning_api.md.
#include "attn_ops.h"

#include <torch/autograd.h>
#include <torch/library.h>

#include <ATen/ATen.h>

namespace attn_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;

OptTensor optional_tensor(const at::Tensor& t) {
  return t.defined() ? OptTensor(t) : std::nullopt;
}

class LightningFunction : public torch::autograd::Function<LightningFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& slope, double scale, const OptTensor& initial_state,
                               const OptTensor& cu_seqlens, std::optional<c10::SymInt> max_seqlen,
                               std::optional<int64_t> block_size) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, final_state] =
        attn_ops::lightning_attention(q, k, v, slope, scale, initial_state, cu_seqlens, max_seqlen, block_size);
    // Only the inputs are saved: the backward recomputes the states, so memory stays linear in T.
    ctx->save_for_backward({q, k, v, slope, initial_state.value_or(at::Tensor()), cu_seqlens.value_or(at::Tensor())});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["max_seqlen"] = max_seqlen.has_value() ? c10::IValue(*max_seqlen) : c10::IValue();
    ctx->saved_data["block_size"] = block_size.has_value() ? c10::IValue(*block_size) : c10::IValue();
    return {out, final_state};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto& data = ctx->saved_data;
    const at::Tensor& q = saved[0];
    at::Tensor dout = grads[0];
    if (!dout.defined()) {  // only final_state was used: out's gradient is zero
      std::vector<c10::SymInt> out_sizes = q.sym_sizes().vec();
      out_sizes.back() = saved[2].sym_size(-1);
      dout = at::zeros_symint(out_sizes, q.options());
    }
    auto [dq, dk, dv, dinit] = attn_ops::lightning_attention_backward(
        dout, optional_tensor(grads[1]), q, saved[1], saved[2], saved[3], data["scale"].toDouble(),
        optional_tensor(saved[4]), optional_tensor(saved[5]), data["max_seqlen"].toOptional<c10::SymInt>(),
        data["block_size"].toOptional<int64_t>());
    return {dq, dk, dv, at::Tensor(), at::Tensor(), saved[4].defined() ? dinit : at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> lightning_attention_autograd(const at::Tensor& q, const at::Tensor& k,
                                                                const at::Tensor& v, const at::Tensor& slope,
                                                                double scale, const OptTensor& initial_state,
                                                                const OptTensor& cu_seqlens,
                                                                std::optional<c10::SymInt> max_seqlen,
                                                                std::optional<int64_t> block_size) {
  variable_list outs =
      LightningFunction::apply(q, k, v, slope, scale, initial_state, cu_seqlens, max_seqlen, block_size);
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Autograd, m) {
  m.impl("lightning_attention", &lightning_attention_autograd);
}

}  // namespace attn_ops
