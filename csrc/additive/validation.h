// Argument preparation of additive_attention / additive_attention_backward, shared by every backend
// (CPU, CUDA, Meta): each checks every argument with the same message and computes the output shapes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <optional>

namespace attn_ops {

// Sizes of one additive attention problem (SymInts, so the Meta kernel traces dynamic shapes).
struct AdditiveProblem {
  c10::SymInt batch, query_len, key_len, hidden, value_dim;
};

// qp [batch, query_len, hidden], kp [batch, key_len, hidden], w [hidden], v [batch, key_len, value_dim],
// key_padding_mask bool [batch, key_len] (True = padded key, ignored).
AdditiveProblem prepare_additive_attention(const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w,
                                           const at::Tensor& v, const std::optional<at::Tensor>& key_padding_mask);

// The forward's checks, plus dout [batch, query_len, value_dim] (dtype of qp), out (as dout),
// lse [batch, query_len] and dlse (as lse) in float32 (float64 for float64 inputs).
AdditiveProblem prepare_additive_attention_backward(const at::Tensor& dout, const std::optional<at::Tensor>& dlse,
                                                    const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w,
                                                    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                    const std::optional<at::Tensor>& key_padding_mask);

// dtype of lse: float32, float64 for float64 inputs.
inline c10::ScalarType additive_lse_dtype(const at::Tensor& qp) {
  return qp.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace attn_ops
