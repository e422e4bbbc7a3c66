// The accumulation type of every kernel, CPU and CUDA: float32 for float16, bfloat16 and float32 inputs,
// float64 for float64 inputs.
#pragma once

#include <type_traits>

namespace attn_ops {

template <typename scalar_t>
using acc_type = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

}  // namespace attn_ops
