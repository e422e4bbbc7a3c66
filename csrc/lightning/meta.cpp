// Meta kernels of the lightning attention ops: the shared entries (lightning/entry.h) without a backend, i.e.
// the preparation and empty outputs of the resolved SymInt shapes (fake tensors, torch.compile with dynamic
// shapes).
#include "lightning/entry.h"

#include <torch/library.h>

namespace attn_ops {

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("lightning_attention", &lightning_attention_on<nullptr>);
  m.impl("lightning_attention_backward", &lightning_attention_backward_on<nullptr>);
  m.impl("lightning_attention_decode_", &lightning_attention_decode_on<nullptr>);
}

}  // namespace attn_ops
