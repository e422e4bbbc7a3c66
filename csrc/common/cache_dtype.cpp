// The checks of KV-cache dtypes and scales (common/cache_dtype.h).
#include "common/cache_dtype.h"

#include "common/attention_checks.h"

#include <ATen/ATen.h>

#include <cmath>

namespace attn_ops {

void check_cache_dtype(const char* op, const NamedTensor& cache) {
  const c10::ScalarType dtype = cache.tensor.scalar_type();
  TORCH_CHECK(is_float_dtype(dtype) || is_8bit_cache_dtype(dtype), op, ": ", cache.name,
              " must be float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2, got ", dtype_name(dtype));
}

namespace {

// Whether `cache` is 8-bit; if so, `values` (the new tokens of a write, q of a read) must be float16, bfloat16 or
// float32 on its device.
bool check_8bit_cache_values(const char* op, const NamedTensor& cache, const NamedTensor& values) {
  const c10::ScalarType dtype = cache.tensor.scalar_type(), values_dtype = values.tensor.scalar_type();
  if (!is_8bit_cache_dtype(dtype)) {
    return false;
  }
  TORCH_CHECK(values_dtype == at::kFloat || values_dtype == at::kBFloat16 || values_dtype == at::kHalf, op, ": ",
              values.name, " must be float16, bfloat16 or float32 with an 8-bit ", cache.name, " (", dtype_name(dtype),
              "), got ", dtype_name(values_dtype));
  check_same_device(op, values.name, values.tensor, cache.name, cache.tensor);
  return true;
}

}  // namespace

void check_cache_write_dtypes(const char* op, const NamedTensor& cache, std::initializer_list<NamedTensor> values) {
  const NamedTensor& first = *values.begin();
  const bool cache_8bit = check_8bit_cache_values(op, cache, first);
  for (const NamedTensor& v : values) {
    const NamedTensor& ref = cache_8bit ? first : cache;
    if (&v != &ref) {
      check_same_dtype_device(op, v.name, v.tensor, ref.name, ref.tensor);
    }
  }
}

void check_cache_read_dtypes(const char* op, std::initializer_list<NamedTensor> queries,
                             std::initializer_list<NamedTensor> caches) {
  check_float_operands(op, queries);
  const NamedTensor &q = *queries.begin(), &first = *caches.begin();
  const bool cache_8bit = check_8bit_cache_values(op, first, q);
  for (const NamedTensor& c : caches) {
    const NamedTensor& ref = cache_8bit ? first : q;
    if (&c != &ref) {
      check_same_dtype_device(op, c.name, c.tensor, ref.name, ref.tensor);
    }
  }
  for (const NamedTensor& c : caches) {
    check_last_dim_contiguous(op, c.name, c.tensor);
  }
}

void check_cache_scale(const char* op, const char* name, const std::optional<at::Tensor>& scale,
                       const c10::SymInt& heads_kv, const NamedTensor& cache) {
  if (!scale.has_value()) {
    return;
  }
  const at::Tensor& s = *scale;
  TORCH_CHECK(is_8bit_cache_dtype(cache.tensor.scalar_type()), op, ": ", name,
              " applies to 8-bit caches (float8_e4m3fn, float8_e5m2) only, but ", cache.name, " is ",
              dtype_name(cache.tensor.scalar_type()));
  TORCH_CHECK(s.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", dtype_name(s.scalar_type()));
  const bool shape_ok = s.dim() == 0 || (s.dim() == 1 && (s.sym_size(0) == 1 || s.sym_size(0) == heads_kv));
  TORCH_CHECK(shape_ok, op, ": ", name, " must have shape [], [1] or [", heads_kv,
              "] (one scale, or one per KV head), got ", shape_str(s));
  check_same_device(op, name, s, cache.name, cache.tensor);
  if (can_read_values(s)) {
    const at::Tensor values = s.reshape(-1).contiguous();
    const float* v = values.const_data_ptr<float>();
    for (int64_t i = 0; i < values.numel(); ++i) {
      TORCH_CHECK(std::isfinite(v[i]) && v[i] > 0, op, ": ", name, " must be positive and finite, got ", v[i],
                  s.dim() == 0 ? std::string() : c10::str(" at index ", i));
    }
  }
}

std::vector<float> scale_per_head(const std::optional<at::Tensor>& scale, int64_t heads) {
  if (!scale.has_value()) {
    return std::vector<float>(heads, 1.f);
  }
  const at::Tensor s = scale->reshape(-1).expand({heads}).to(at::kCPU).contiguous();
  return std::vector<float>(s.const_data_ptr<float>(), s.const_data_ptr<float>() + heads);
}

void check_backend_reads_cache(const char* op, const NamedTensor& cache, const char* backend) {
  TORCH_CHECK(!is_8bit_cache_dtype(cache.tensor.scalar_type()), op, ": ", cache.name, " is ",
              dtype_name(cache.tensor.scalar_type()), ": 8-bit caches run on the CPU only so far; the ", backend,
              " kernels read and write float16, bfloat16, float32 and float64 caches");
}

}  // namespace attn_ops
