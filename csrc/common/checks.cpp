// can_read_values (the one place that knows when a value check must be skipped) and the checks that
// compare several arguments.
#include "common/checks.h"

#include "common/memory_overlap.h"

#include <c10/core/InferenceMode.h>

#include <sstream>

namespace attn_ops {

bool can_read_values(const at::Tensor& t) {
  if (t.device().type() == c10::DeviceType::Meta) {
    return false;
  }
  // CUDA values are checked on the device, before the op's writes (common/cuda/index_checks.h): reading
  // them here would synchronise every eager call.
  return !t.is_cuda();
}

namespace {

void check_not_inference_tensor(const char* op, const char* name, const at::Tensor& out) {
  // PyTorch's own in-place ops refuse this too (an inference tensor has no version counter). Without this check
  // ours raised only at the version bump after the write (common/no_autograd.cpp), or not at all when no
  // argument had autograd keys (every argument an inference tensor).
  TORCH_CHECK(!out.is_inference() || c10::InferenceMode::is_enabled(), op, ": ", name,
              " is written in place but is an inference tensor (made under torch.inference_mode()), which PyTorch "
              "only lets be written in place under torch.inference_mode(); run the call under it too, or clone() the "
              "tensor outside it");
}

}  // namespace

void check_in_place_target(const char* op, const NamedTensor& target, std::initializer_list<NamedTensor> others) {
  const at::Tensor& out = target.tensor;
  // Layout only, so Meta tensors too: CPU and Meta refuse the same outputs.
  TORCH_CHECK(!shares_elements(out), op, ": ", target.name,
              " is written in place but some of its elements share memory (e.g. a dimension of size > 1 with stride ",
              "0, as from expand()), got shape ", shape_str(out), " and strides ", out.sym_strides(),
              "; write into a tensor that owns its elements (e.g. .clone() it)");
  if (out.is_meta()) {
    return;  // no memory to compare with the other arguments
  }
  check_not_inference_tensor(op, target.name, out);
  for (const NamedTensor& other : others) {
    if (!other.tensor.defined() || other.tensor.is_meta()) {
      continue;
    }
    TORCH_CHECK(!shares_memory(out, other.tensor), op, ": ", target.name,
                " is written in place and must not share memory with ", other.name,
                ", but they overlap; pass separate tensors (e.g. .clone() one of them)");
  }
}

void check_one_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  const c10::Device first = tensors.begin()->tensor.device();
  bool same = true;
  for (const NamedTensor& t : tensors) {
    same = same && t.tensor.device() == first;
  }
  if (same) {
    return;
  }
  std::ostringstream names, devices;
  size_t i = 0;
  for (const NamedTensor& t : tensors) {
    const char* sep = i == 0 ? "" : (i + 1 == tensors.size() ? " and " : ", ");
    names << sep << t.name;
    devices << (i == 0 ? "" : ", ") << t.name << " on " << t.tensor.device();
    ++i;
  }
  TORCH_CHECK(false, op, ": ", names.str(), " must be on the same device, got ", devices.str());
}

}  // namespace attn_ops
