// CPU prefill kernels (the tiled forward and backward of attention): the interface between the run-time
// dispatch (prefill_cpu.cpp) and the per-instruction-set copies (forward_tiles.h and backward_tiles.h,
// compiled once per ISA in prefill_isa_*.cpp).
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "common/cpu_isa.h"

#include <type_traits>

namespace attn_ops::cpu {

// The forward and backward of one dtype, as attention_forward_kernel / attention_backward_kernel.
template <typename scalar_t>
struct PrefillKernels {
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  decltype(&attention_forward_kernel<scalar_t, acc_t>) forward;
  decltype(&attention_forward_kernel<scalar_t, acc_t, uint8_t>) forward_8bit;  // over an 8-bit cache
  decltype(&attention_backward_kernel<scalar_t, acc_t>) backward;
};

#define ATTN_OPS_DECLARE_PREFILL(ns)        \
  namespace ns {                            \
  template <typename scalar_t>              \
  PrefillKernels<scalar_t> prefill_kernels(); \
  }
ATTN_OPS_DECLARE_PREFILL(prefill_default)
#ifdef ATTN_OPS_X86_ISA_COPIES
ATTN_OPS_DECLARE_PREFILL(prefill_avx2)
ATTN_OPS_DECLARE_PREFILL(prefill_avx512)
#endif
#undef ATTN_OPS_DECLARE_PREFILL

}  // namespace attn_ops::cpu
