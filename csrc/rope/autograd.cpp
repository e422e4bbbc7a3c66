// Autograd of the out-of-place rotary embedding: a rotation's gradient is the inverse rotation.
#include "attn_ops.h"

#include <torch/autograd.h>
#include <torch/library.h>

namespace attn_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, bool interleaved, bool inverse) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({cos, sin, positions});
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["inverse"] = inverse;
    return attn_ops::rotary_embedding(x, cos, sin, positions, interleaved, inverse);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor grad = grads[0];
    if (grad.sym_stride(-1) != 1) {  // expanded gradients (x.sum()) have stride 0
      grad = grad.contiguous();
    }
    const at::Tensor dx = attn_ops::rotary_embedding(grad, saved[0], saved[1], saved[2],
                                                     ctx->saved_data["interleaved"].toBool(),
                                                     !ctx->saved_data["inverse"].toBool());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor rotary_embedding_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& positions, bool interleaved, bool inverse) {
  return RotaryFunction::apply(x, cos, sin, positions, interleaved, inverse);
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Autograd, m) {
  m.impl("rotary_embedding", &rotary_embedding_autograd);
}

}  // namespace attn_ops
