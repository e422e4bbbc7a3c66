// Small device helpers shared by the CUDA kernels of every op family.
#pragma once

#include "common/acc_type.h"

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

namespace attn_ops::cuda {

constexpr int kWarpSize = 32;

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

template <typename T>
__device__ __forceinline__ acc_type<T> to_acc(T x) {
  return static_cast<acc_type<T>>(x);
}

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// max(a, b) that propagates NaN (fmaxf / max return the other operand): a NaN score must reach the row's
// output and lse, never pass for "no visible key" (as on the CPU).
template <typename A>
__device__ __forceinline__ A nan_max(A a, A b) {
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Calls f(data) with the data of a contiguous int32 or int64 index tensor, as const int32_t* or
// const int64_t* (slot mappings and positions may be either).
template <typename F>
void with_index_data(const at::Tensor& index, F&& f) {
  if (index.scalar_type() == at::kLong) {
    f(index.const_data_ptr<int64_t>());
  } else {
    f(index.const_data_ptr<int32_t>());
  }
}

// The element type behind a pointer given to a with_index_data callback.
template <typename Pointer>
using pointee_t = std::remove_const_t<std::remove_pointer_t<Pointer>>;

// Number of streaming multiprocessors of the current device (sizes grids for split-KV).
inline int sm_count() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

}  // namespace attn_ops::cuda
