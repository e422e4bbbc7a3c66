// The dtypes of KV caches and the dequantization scales of 8-bit ones, with their checks: shared by the cache
// writes, the attention reads and MLA, on every backend (CPU, CUDA, Meta). Semantics: docs/kvcache_api.md
// ("8-bit caches").
#pragma once

#include "common/checks.h"

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>
#include <vector>

namespace attn_ops {

// float8_e4m3fn and float8_e5m2: the 8-bit cache dtypes.
inline bool is_8bit_cache_dtype(c10::ScalarType t) {
  return t == c10::ScalarType::Float8_e4m3fn || t == c10::ScalarType::Float8_e5m2;
}

// The dequantization scales of a cache's keys and values (the latent cache of MLA: one scale, both), as given:
// float32, one value ([] or [1]) or one per KV head ([heads_kv]). A reader uses stored * scale.
struct CacheScales {
  std::optional<at::Tensor> k, v;
};

// A cache's dtype: float16, bfloat16, float32, float64, or 8-bit (float8_e4m3fn, float8_e5m2).
void check_cache_dtype(const char* op, const NamedTensor& cache);

// The new tokens of a cache write (`values`: k and v, or c_kv and k_pe) for `cache`: of the cache's dtype, or, for
// an 8-bit cache, float16 / bfloat16 / float32 and all of the first one's dtype; on the cache's device.
void check_cache_write_dtypes(const char* op, const NamedTensor& cache, std::initializer_list<NamedTensor> values);

// The queries of a cache read (check_float_operands) and its caches: of the first query's dtype, or all 8-bit of
// the first cache's dtype (the queries then float16, bfloat16 or float32); each with stride 1 in its last dim.
void check_cache_read_dtypes(const char* op, std::initializer_list<NamedTensor> queries,
                             std::initializer_list<NamedTensor> caches);

// A scale: None, or float32 [] / [1] / [heads_kv] on the cache's device, given only with an 8-bit cache; where
// its values can be read (CPU), each positive and finite.
void check_cache_scale(const char* op, const char* name, const std::optional<at::Tensor>& scale,
                       const c10::SymInt& heads_kv, const NamedTensor& cache);

// The values of a validated scale (None: 1), one per head: [heads] (read on the host).
std::vector<float> scale_per_head(const std::optional<at::Tensor>& scale, int64_t heads);

// A backend without 8-bit cache kernels (CUDA, so far) refuses an 8-bit cache before anything runs.
void check_backend_reads_cache(const char* op, const NamedTensor& cache, const char* backend);

}  // namespace attn_ops
