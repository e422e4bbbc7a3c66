// Meta kernels of the MLA ops: the shared checks (mla_cache_append), and the absorbed decode template
// without a backend (mla_decode: the preparation and empty outputs of its SymInt shapes).
#include "mla/absorbed_decode.h"
#include "mla/validation.h"

#include <torch/library.h>

namespace attn_ops {
namespace {

void mla_cache_append_meta(const at::Tensor& latent_cache, const at::Tensor& c_kv, const at::Tensor& k_pe,
                           const std::optional<at::Tensor>& cache_seqlens,
                           const std::optional<at::Tensor>& slot_mapping,
                           const std::optional<at::Tensor>& cache_batch_idx,
                           const std::optional<at::Tensor>& kv_scale) {
  check_mla_cache_append_inputs(latent_cache, c_kv, k_pe, cache_seqlens, slot_mapping, cache_batch_idx, kv_scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("mla_cache_append", &mla_cache_append_meta);
  m.impl("mla_decode", &mla_decode_on<nullptr>);
}

}  // namespace attn_ops
