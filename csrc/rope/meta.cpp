// Meta kernels of the rotary embedding ops: the shared checks, and an empty output of x's SymInt shape.
#include "rope/validation.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace attn_ops {
namespace {

at::Tensor rotary_embedding_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& positions, bool interleaved, bool inverse) {
  check_rotary_inputs("attn_ops.rotary_embedding", x, cos, sin, positions);
  return at::empty_symint(x.sym_sizes(), x.options());
}

void rotary_embedding__meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, bool interleaved, bool inverse) {
  check_rotary_inplace_inputs(x, cos, sin, positions);
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("rotary_embedding", &rotary_embedding_meta);
  m.impl("rotary_embedding_", &rotary_embedding__meta);
}

}  // namespace attn_ops
