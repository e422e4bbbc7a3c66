// One instruction set's copy of the prefill kernels: included by prefill_isa_*.cpp after they set the
// target (common/cpu_isa_target.h) and ATTN_OPS_PREFILL_NS, the namespace of the copy.
#pragma once

#include "attention/cpu/backward_tiles.h"
#include "attention/cpu/forward_tiles.h"

#include <type_traits>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

template <typename scalar_t>
PrefillKernels<scalar_t> prefill_kernels() {
  using acc_t = typename PrefillKernels<scalar_t>::acc_t;
  if constexpr (std::is_same_v<scalar_t, double>) {  // 8-bit caches hold float16, bfloat16 or float32 models' keys
    return {&forward_tiles<scalar_t, acc_t>, nullptr, &backward_tiles<scalar_t, acc_t>};
  } else {
    return {&forward_tiles<scalar_t, acc_t>, &forward_tiles<scalar_t, acc_t, uint8_t>, &backward_tiles<scalar_t, acc_t>};
  }
}
template PrefillKernels<float> prefill_kernels<float>();
template PrefillKernels<double> prefill_kernels<double>();
template PrefillKernels<c10::Half> prefill_kernels<c10::Half>();
template PrefillKernels<c10::BFloat16> prefill_kernels<c10::BFloat16>();

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
