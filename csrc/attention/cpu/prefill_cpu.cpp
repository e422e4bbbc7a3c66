// The CPU prefill kernels' entry points: attention_forward_kernel / attention_backward_kernel run the copy
// (prefill_isa_*.cpp) of the best instruction set this CPU has, chosen at every call (common/cpu_isa.h).
#include "attention/cpu/prefill_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

namespace attn_ops::cpu {
namespace {

template <typename scalar_t>
PrefillKernels<scalar_t> prefill_kernels_for_this_cpu() {
  return ATTN_OPS_FOR_THIS_CPU(prefill, prefill_kernels<scalar_t>());
}

}  // namespace

template <typename scalar_t, typename acc_t, typename cache_t>
void attention_forward_kernel(const AttentionProblem& p, const scalar_t* q, const SeqLayout& q_layout,
                              const cache_t* k, const KeyLayout& k_layout, const cache_t* v,
                              const KeyLayout& v_layout, scalar_t* out, const SeqLayout& out_layout, acc_t* lse,
                              const SeqLayout& lse_layout) {
  const PrefillKernels<scalar_t> kernels = prefill_kernels_for_this_cpu<scalar_t>();
  if constexpr (std::is_same_v<cache_t, scalar_t>) {
    kernels.forward(p, q, q_layout, k, k_layout, v, v_layout, out, out_layout, lse, lse_layout);
  } else {
    kernels.forward_8bit(p, q, q_layout, k, k_layout, v, v_layout, out, out_layout, lse, lse_layout);
  }
}

template <typename scalar_t, typename acc_t>
void attention_backward_kernel(const AttentionProblem& p, const scalar_t* dout, const SeqLayout& dout_layout,
                               const scalar_t* q, const SeqLayout& q_layout, const scalar_t* k,
                               const SeqLayout& k_layout, const scalar_t* v, const SeqLayout& v_layout,
                               const scalar_t* out, const SeqLayout& out_layout, const acc_t* lse, const acc_t* dlse,
                               const SeqLayout& lse_layout, scalar_t* dq, const SeqLayout& dq_layout, scalar_t* dk,
                               const SeqLayout& dk_layout, scalar_t* dv, const SeqLayout& dv_layout) {
  prefill_kernels_for_this_cpu<scalar_t>().backward(p, dout, dout_layout, q, q_layout, k, k_layout, v, v_layout, out,
                                                    out_layout, lse, dlse, lse_layout, dq, dq_layout, dk, dk_layout,
                                                    dv, dv_layout);
}

#define ATTN_OPS_INSTANTIATE_PREFILL(scalar_t)                                                                      \
  template void attention_forward_kernel<scalar_t, PrefillKernels<scalar_t>::acc_t>(                               \
      const AttentionProblem&, const scalar_t*, const SeqLayout&, const scalar_t*, const KeyLayout&, const scalar_t*, \
      const KeyLayout&, scalar_t*, const SeqLayout&, PrefillKernels<scalar_t>::acc_t*, const SeqLayout&);           \
  template void attention_backward_kernel<scalar_t, PrefillKernels<scalar_t>::acc_t>(                              \
      const AttentionProblem&, const scalar_t*, const SeqLayout&, const scalar_t*, const SeqLayout&,                \
      const scalar_t*, const SeqLayout&, const scalar_t*, const SeqLayout&, const scalar_t*, const SeqLayout&,      \
      const PrefillKernels<scalar_t>::acc_t*, const PrefillKernels<scalar_t>::acc_t*, const SeqLayout&, scalar_t*, \
      const SeqLayout&, scalar_t*, const SeqLayout&, scalar_t*, const SeqLayout&);
ATTN_OPS_INSTANTIATE_PREFILL(float)
ATTN_OPS_INSTANTIATE_PREFILL(double)
ATTN_OPS_INSTANTIATE_PREFILL(c10::Half)
ATTN_OPS_INSTANTIATE_PREFILL(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE_PREFILL

#define ATTN_OPS_INSTANTIATE_PREFILL_8BIT(scalar_t)                                                                 \
  template void attention_forward_kernel<scalar_t, PrefillKernels<scalar_t>::acc_t, uint8_t>(                      \
      const AttentionProblem&, const scalar_t*, const SeqLayout&, const uint8_t*, const KeyLayout&, const uint8_t*, \
      const KeyLayout&, scalar_t*, const SeqLayout&, PrefillKernels<scalar_t>::acc_t*, const SeqLayout&);
ATTN_OPS_INSTANTIATE_PREFILL_8BIT(float)
ATTN_OPS_INSTANTIATE_PREFILL_8BIT(c10::Half)
ATTN_OPS_INSTANTIATE_PREFILL_8BIT(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE_PREFILL_8BIT

}  // namespace attn_ops::cpu
