// Kernel attributes set once per (kernel, device) instead of before every launch: cudaFuncSetAttribute is
// a driver call that costs microseconds, as much as a whole decode kernel.
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>

namespace attn_ops::cuda {

// Allows `Kernel` at least `bytes` of dynamic shared memory on the current device (set once, then only
// raised: the attribute is a maximum, so a smaller launch after a larger one needs no call).
// The set runs under a lock: two threads raising the limit at once could otherwise leave the attribute at the
// smaller value while the record says the larger, and the larger launch would then fail.
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
  static std::array<std::atomic<int>, C10_COMPILE_TIME_MAX_GPUS> allowed{};  // zero: nothing set yet
  static std::mutex raising;
  std::atomic<int>& done = allowed.at(static_cast<size_t>(c10::cuda::current_device()));
  if (done.load(std::memory_order_acquire) >= bytes) {
    return;
  }
  const std::lock_guard<std::mutex> lock(raising);
  if (done.load(std::memory_order_relaxed) >= bytes) {
    return;
  }
  C10_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.store(bytes, std::memory_order_release);
}

}  // namespace attn_ops::cuda
