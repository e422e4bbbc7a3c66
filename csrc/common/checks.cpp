// can_read_values: the one place that knows when a value check must be skipped.
#include "common/checks.h"

namespace attn_ops {

bool can_read_values(const at::Tensor& t) {
  if (t.device().type() == c10::DeviceType::Meta) {
    return false;
  }
  // CUDA values are checked on the device, before the op's writes (common/cuda/index_checks.h): reading
  // them here would synchronise every eager call.
  return !t.is_cuda();
}

}  // namespace attn_ops
