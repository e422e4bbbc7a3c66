// can_read_values: the one place that knows when a value check must be skipped.
#include "common/checks.h"

#ifdef ATTN_OPS_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace attn_ops {

bool can_read_values(const at::Tensor& t) {
  if (t.device().type() == c10::DeviceType::Meta) {
    return false;
  }
#ifdef ATTN_OPS_WITH_CUDA
  if (t.is_cuda()) {
    const c10::cuda::CUDAGuard guard(t.device());
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
  }
#endif
  return true;
}

}  // namespace attn_ops
