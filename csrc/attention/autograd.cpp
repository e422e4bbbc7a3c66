// Autograd for attention, registered in C++ at the Autograd key so LibTorch programs get gradients
// too. The backward is its own operator (attention_backward), so traced joint graphs hold two opaque
// ops.
#include "attn_ops.h"  // the public C++ API
#include "attention/validation.h"
#include "common/attention_checks.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace attn_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The gradient of the sink logits: a sink is a key of score sinks[h] and value 0, so
// d loss / d sinks[h] = sum over rows of P_sink * (dlse - delta), with P_sink = exp(sinks[h] - lse) (lse includes
// the sink) and delta = rowsum(dout * out), summed over batch and rows. out [B, Tq, Hq, Dv] (varlen
// [total_q, Hq, Dv]), lse [B, Hq, Tq] (varlen [Hq, total_q]).
at::Tensor sinks_gradient(const at::Tensor& sinks, const at::Tensor& dout, const at::Tensor& out,
                          const at::Tensor& lse, const std::optional<at::Tensor>& dlse, bool varlen) {
  const auto acc = lse.scalar_type();
  at::Tensor delta = (dout.to(acc) * out.to(acc)).sum(-1);  // [B, Tq, Hq] / [total_q, Hq]
  delta = varlen ? delta.t() : delta.transpose(1, 2);     // as lse
  const at::Tensor logit = varlen ? sinks.to(acc).unsqueeze(1) : sinks.to(acc).view({1, -1, 1});
  // A row whose lse is -inf (no key and a -inf sink) has no sink weight.
  const at::Tensor weight = at::where(at::isneginf(lse), at::zeros_like(lse), at::exp(logit - lse));
  const at::Tensor grad = weight * (dlse.has_value() ? *dlse - delta : -delta);
  return (varlen ? grad.sum(1) : grad.sum(at::IntArrayRef{0, 2})).to(sinks.scalar_type());
}

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                               double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                               const std::optional<at::Tensor>& cu_seqlens_k, std::optional<c10::SymInt> max_seqlen_q,
                               std::optional<c10::SymInt> max_seqlen_k, const std::optional<at::Tensor>& sinks,
                               int64_t attention_chunk, const std::optional<at::Tensor>& alibi_slopes,
                               bool deterministic) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = attn_ops::attention(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                                          cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks, attention_chunk,
                                          alibi_slopes, deterministic);
    ctx->save_for_backward({q, k, v, out, lse, cu_seqlens_q.value_or(at::Tensor()),
                            cu_seqlens_k.value_or(at::Tensor()), sinks.value_or(at::Tensor()),
                            alibi_slopes.value_or(at::Tensor())});
    ctx->saved_data["attention_chunk"] = attention_chunk;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["max_seqlen_q"] = max_seqlen_q.has_value() ? c10::IValue(*max_seqlen_q) : c10::IValue();
    ctx->saved_data["max_seqlen_k"] = max_seqlen_k.has_value() ? c10::IValue(*max_seqlen_k) : c10::IValue();
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    auto optional_tensor = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    auto& data = ctx->saved_data;
    // Either output may be unused by the loss; an unused output contributes no gradient. Incoming
    // gradients can be expanded (out.sum() gives stride 0), and the kernels read rows with stride 1.
    at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(out);
    if (dout.sym_stride(-1) != 1) {
      dout = dout.contiguous();
    }
    auto [dq, dk, dv] = attn_ops::attention_backward(
        dout, q, k, v, out, lse, optional_tensor(grads[1]), data["scale"].toOptional<double>(),
        data["causal"].toBool(), data["window_left"].toInt(), data["window_right"].toInt(), data["softcap"].toDouble(),
        optional_tensor(saved[5]), optional_tensor(saved[6]), data["max_seqlen_q"].toOptional<c10::SymInt>(),
        data["max_seqlen_k"].toOptional<c10::SymInt>(), data["attention_chunk"].toInt(), optional_tensor(saved[8]),
        data["deterministic"].toBool());
    const at::Tensor& sinks = saved[7];
    // Edges are the defined tensor arguments: q, k, v, (cu_seqlens_q, cu_seqlens_k,) sinks.
    const size_t sinks_edge = saved[5].defined() ? 5 : 3;
    const at::Tensor dsinks = sinks.defined() && ctx->needs_input_grad(sinks_edge)
                                  ? sinks_gradient(sinks, dout, out, lse, optional_tensor(grads[1]), saved[5].defined())
                                  : at::Tensor();
    // One entry per forward argument (16); the non-tensor ones, cu_seqlens and alibi_slopes get none.
    variable_list grads_in(16);
    grads_in[0] = dq;
    grads_in[1] = dk;
    grads_in[2] = dv;
    grads_in[12] = dsinks;  // sinks is the 13th argument
    return grads_in;
  }
};

std::tuple<at::Tensor, at::Tensor> attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      std::optional<double> scale, bool causal, int64_t window_left,
                                                      int64_t window_right, double softcap,
                                                      const std::optional<at::Tensor>& cu_seqlens_q,
                                                      const std::optional<at::Tensor>& cu_seqlens_k,
                                                      std::optional<c10::SymInt> max_seqlen_q,
                                                      std::optional<c10::SymInt> max_seqlen_k,
                                                      const std::optional<at::Tensor>& sinks,
                                                      int64_t attention_chunk,
                                                      const std::optional<at::Tensor>& alibi_slopes,
                                                      bool deterministic) {
  check_alibi_not_differentiable("attn_ops.attention", alibi_slopes);
  variable_list outs = AttentionFunction::apply(q, k, v, scale, causal, window_left, window_right, softcap,
                                                cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks,
                                                attention_chunk, alibi_slopes, deterministic);
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Autograd, m) {
  m.impl("attention", &attention_autograd);
}

}  // namespace attn_ops
