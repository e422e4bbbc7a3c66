// Meta kernels of the lightning attention ops: the shared preparation, then empty outputs of the resolved
// SymInt shapes (fake tensors and torch.compile with dynamic shapes).
#include "lightning/validation.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace attn_ops {
namespace {

std::tuple<at::Tensor, at::Tensor> lightning_attention_meta(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v, const at::Tensor& slope,
                                                            double scale,
                                                            const std::optional<at::Tensor>& initial_state,
                                                            const std::optional<at::Tensor>& cu_seqlens,
                                                            std::optional<int64_t> max_seqlen,
                                                            std::optional<int64_t> block_size) {
  const LightningProblem p = prepare_lightning_attention("attn_ops.lightning_attention", q, k, v, slope, scale,
                                                         initial_state, cu_seqlens, max_seqlen, block_size);
  return {at::empty_symint(p.out_sizes, q.options()), at::empty_symint(p.state_sizes, q.options().dtype(p.state_dtype))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lightning_attention_backward_meta(
    const at::Tensor& dout, const std::optional<at::Tensor>& dfinal_state, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& slope, double scale, const std::optional<at::Tensor>& initial_state,
    const std::optional<at::Tensor>& cu_seqlens, std::optional<int64_t> max_seqlen,
    std::optional<int64_t> block_size) {
  const LightningProblem p = prepare_lightning_attention_backward(dout, dfinal_state, q, k, v, slope, scale, initial_state,
                                                                  cu_seqlens, max_seqlen, block_size);
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options()),
          at::empty_symint(v.sym_sizes(), v.options()),
          at::empty_symint(p.state_sizes, q.options().dtype(p.state_dtype))};
}

at::Tensor lightning_attention_decode__meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const at::Tensor& state, const at::Tensor& slope, double scale,
                                            const std::optional<at::Tensor>& state_indices) {
  const LightningProblem p = prepare_lightning_decode(q, k, v, state, slope, scale, state_indices);
  return at::empty_symint(p.out_sizes, q.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("lightning_attention", &lightning_attention_meta);
  m.impl("lightning_attention_backward", &lightning_attention_backward_meta);
  m.impl("lightning_attention_decode_", &lightning_attention_decode__meta);
}

}  // namespace attn_ops
