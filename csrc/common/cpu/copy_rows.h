// Row copies into caches: the CPU building block of every cache write (a copy is exact in every dtype, so it
// needs no dtype dispatch, except into an 8-bit cache, which quantizes).
#pragma once

#include "common/cache_dtype.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

namespace attn_ops::cpu {

// The cache row each of `batch` rows writes: cache_batch_idx (validated int32 [batch]), or b.
inline std::vector<int64_t> batch_rows(const std::optional<at::Tensor>& cache_batch_idx, int64_t batch) {
  std::vector<int64_t> rows(batch);
  const at::Tensor idx = cache_batch_idx.has_value() ? cache_batch_idx->contiguous() : at::Tensor();
  for (int64_t b = 0; b < batch; ++b) {
    rows[b] = idx.defined() ? idx.const_data_ptr<int32_t>()[b] : b;
  }
  return rows;
}

// For an append of `added` tokens per batch row at positions len[b] .. len[b] + added - 1 of cache row rows[b]:
// whether each token t = b * added + i is overwritten by a higher batch row of the same cache row (repeated
// cache_batch_idx values), so that the highest batch row's token lands wherever writes overlap, whatever the
// thread order. Empty when no cache row repeats (the common case costs one sort of the batch).
inline std::vector<char> superseded_tokens(const std::vector<int64_t>& rows, const int32_t* len, int64_t added) {
  const int64_t batch = static_cast<int64_t>(rows.size());
  std::vector<int64_t> order(batch);
  for (int64_t b = 0; b < batch; ++b) {
    order[b] = b;
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rows[a] < rows[b]; });
  std::vector<char> skip;
  for (int64_t first = 0, last; first < batch; first = last) {
    for (last = first + 1; last < batch && rows[order[last]] == rows[order[first]]; ++last) {
    }
    for (int64_t x = first; x < last; ++x) {  // the batch rows of one cache row, ascending
      for (int64_t y = x + 1; y < last; ++y) {
        const int64_t b = order[x], o = order[y];
        for (int64_t i = 0; i < added; ++i) {
          if (len[b] + i >= len[o] && len[b] + i < len[o] + added) {
            skip.resize(batch * added, 0);
            skip[b * added + i] = 1;
          }
        }
      }
    }
  }
  return skip;
}

// Copies the `dim` elements of one head row.
inline void copy_row(char* dst, const char* src, int64_t dim, int64_t elem_size) {
  std::memcpy(dst, src, dim * elem_size);
}

// f(fp8_t{}) with the C++ type of an 8-bit cache dtype (float8_e4m3fn or float8_e5m2).
template <typename F>
inline void with_8bit_type(c10::ScalarType dtype, const F& f) {
  if (dtype == c10::ScalarType::Float8_e4m3fn) {
    f(c10::Float8_e4m3fn());
  } else {
    TORCH_CHECK(dtype == c10::ScalarType::Float8_e5m2, "attn_ops: not an 8-bit cache dtype: ", dtype);
    f(c10::Float8_e5m2());
  }
}

// Stores one row of n values in an 8-bit cache: saturate(x / scale) rounded to nearest even, saturating at the
// format's largest finite value; NaN stays NaN (its comparisons are false).
template <typename fp8_t, typename src_t>
inline void quantize_row(fp8_t* dst, const src_t* src, int64_t n, float scale) {
  const float largest = static_cast<float>(std::numeric_limits<fp8_t>::max());
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(src[i]) / scale;
    dst[i] = static_cast<fp8_t>(x > largest ? largest : x < -largest ? -largest : x);
  }
}

// dst[dst_offset(t, h)] = src[src_offset(t, h)] (src.size(-1) elements) for t < tokens, h < heads; offsets
// in elements; a negative dst offset skips the row. An 8-bit dst (float8_e4m3fn / float8_e5m2; src float16,
// bfloat16 or float32) stores each row quantized with its head's scale (quantize_row, scale[h]).
template <typename DstOffset, typename SrcOffset>
inline void copy_rows(const at::Tensor& dst, const at::Tensor& src, int64_t tokens, int64_t heads,
                      const DstOffset& dst_offset, const SrcOffset& src_offset,
                      const std::optional<at::Tensor>& scale = std::nullopt) {
  const int64_t dim = src.size(-1), elem = src.element_size();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, heads * dim));  // ~4K elements a chunk
  // write(to, from, h): the row of head h at src offset `from` into dst offset `to`
  const auto for_each_row = [&](const auto& write) {
    at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t to = dst_offset(t, h);
          if (to >= 0) {
            write(to, src_offset(t, h), h);
          }
        }
      }
    });
  };
  if (dst.scalar_type() == src.scalar_type()) {
    char* d = static_cast<char*>(dst.data_ptr());
    const char* s = static_cast<const char*>(src.const_data_ptr());
    for_each_row([&](int64_t to, int64_t from, int64_t) { copy_row(d + to * elem, s + from * elem, dim, elem); });
    return;
  }
  const std::vector<float> scales = scale_per_head(scale, heads);
  with_8bit_type(dst.scalar_type(), [&](auto tag) {
    using fp8_t = decltype(tag);
    fp8_t* d = dst.mutable_data_ptr<fp8_t>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "attn_ops.copy_rows", [&] {
      const scalar_t* s = src.const_data_ptr<scalar_t>();
      for_each_row([&](int64_t to, int64_t from, int64_t h) { quantize_row(d + to, s + from, dim, scales[h]); });
    });
  });
}

}  // namespace attn_ops::cpu
