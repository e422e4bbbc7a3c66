// record_launch, and the diagnostic op that reads it back: _cuda_last_launch(Tensor device, str kernel)
// -> int[] (empty when the kernel has not run in this process). Its schema is in registration.cpp with the
// others; only CUDA builds have its kernel. For tests, not an API; `device` only names the dispatch key.
#include "attention/cuda/launch_record.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <map>
#include <mutex>

namespace attn_ops::cuda {
namespace {

std::mutex& records_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, std::vector<int64_t>>& records() {
  static std::map<std::string, std::vector<int64_t>> r;
  return r;
}

std::map<std::string, std::string>& routes() {
  static std::map<std::string, std::string> r;
  return r;
}

std::vector<int64_t> last_launch(const at::Tensor& /*device*/, const std::string& kernel) {
  const std::lock_guard<std::mutex> lock(records_mutex());
  const auto it = records().find(kernel);
  return it == records().end() ? std::vector<int64_t>{} : it->second;
}

std::string last_route(const at::Tensor& /*device*/, const std::string& stage) {
  const std::lock_guard<std::mutex> lock(records_mutex());
  const auto it = routes().find(stage);
  return it == routes().end() ? std::string() : it->second;
}

}  // namespace

void record_launch(const std::string& kernel, std::vector<int64_t> values) {
  const std::lock_guard<std::mutex> lock(records_mutex());
  records()[kernel] = std::move(values);
}

void record_route(const std::string& stage, std::string route) {
  const std::lock_guard<std::mutex> lock(records_mutex());
  routes()[stage] = std::move(route);
}

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("_cuda_last_launch", &last_launch);
  m.impl("_cuda_last_route", &last_route);
}

}  // namespace attn_ops::cuda
