// The public C++ API (attention.h): typed calls through the dispatcher, so LibTorch programs get the
// same backend selection and autograd as torch.ops.attn_ops.* in Python.
#include "attention.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace attn_ops {

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             std::optional<double> scale, bool causal, int64_t window_left,
                                             int64_t window_right, double softcap,
                                             const std::optional<at::Tensor>& cu_seqlens_q,
                                             const std::optional<at::Tensor>& cu_seqlens_k,
                                             std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::attention", "")
                             .typed<decltype(attention)>();
  return op.call(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& dlse, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, std::optional<int64_t> max_seqlen_q,
    std::optional<int64_t> max_seqlen_k) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::attention_backward", "")
                             .typed<decltype(attention_backward)>();
  return op.call(dout, q, k, v, out, lse, dlse, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                 cu_seqlens_k, max_seqlen_q, max_seqlen_k);
}

}  // namespace attn_ops
