// Meta kernels of the attention ops (fake tensors, torch.compile with dynamic shapes): the op templates of
// attention/entry.h without a backend, i.e. the shared preparation and empty outputs of its SymInt shapes.
#include "attention/entry.h"

#include <torch/library.h>

namespace attn_ops {

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("attention", &attention_on<nullptr>);
  m.impl("attention_backward", &attention_backward_on<nullptr>);
  m.impl("attention_with_kvcache", &attention_with_kvcache_on<nullptr>);
}

}  // namespace attn_ops
