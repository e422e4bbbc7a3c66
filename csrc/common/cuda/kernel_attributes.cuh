// Kernel attributes set once per (kernel, device) instead of before every launch: cudaFuncSetAttribute is
// a driver call that costs microseconds, as much as a whole decode kernel.
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <array>
#include <atomic>

namespace attn_ops::cuda {

// Allows `Kernel` at least `bytes` of dynamic shared memory on the current device (set once, then only
// raised: the attribute is a maximum, so a smaller launch after a larger one needs no call).
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
  static std::array<std::atomic<int>, C10_COMPILE_TIME_MAX_GPUS> allowed{};  // zero: nothing set yet
  std::atomic<int>& done = allowed.at(static_cast<size_t>(c10::cuda::current_device()));
  if (done.load(std::memory_order_acquire) >= bytes) {
    return;
  }
  C10_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int seen = done.load(std::memory_order_relaxed);
  while (seen < bytes && !done.compare_exchange_weak(seen, bytes, std::memory_order_release)) {
  }
}

}  // namespace attn_ops::cuda
