// Prepared attention calls over meta tensors, for the tests of the CUDA backend's host-side decisions: the ops'
// own preparations build them, so a test sees exactly what the CUDA backend would be handed, without a GPU.
#pragma once

#include "attention/validation.h"

#include <ATen/ATen.h>

#include <optional>

namespace attn_ops_test {

using attn_ops::AttentionBackwardCall;
using attn_ops::AttentionCall;
using attn_ops::KvCacheRows;
using attn_ops::PatternOptions;

inline at::Tensor meta(at::IntArrayRef sizes, at::ScalarType dtype = at::kBFloat16) {
  return at::empty(sizes, at::TensorOptions().device(at::kMeta).dtype(dtype));
}

// A dense call: q [B, Tq, Hq, D], k / v [B, Tk, Hkv, D (Dv)].
struct Dense {
  int64_t batch = 2, tq = 128, tk = 128, hq = 8, hkv = 2, dqk = 128, dv = 128;
  at::ScalarType dtype = at::kBFloat16;
  bool causal = true;
  int64_t window_left = -1;
  double softcap = 0.0;
  PatternOptions patterns;

  AttentionCall forward() const {
    return attn_ops::prepare_attention(meta({batch, tq, hq, dqk}, dtype), meta({batch, tk, hkv, dqk}, dtype),
                                       meta({batch, tk, hkv, dv}, dtype), std::nullopt, causal, window_left, -1,
                                       softcap, std::nullopt, std::nullopt, std::nullopt, std::nullopt, patterns);
  }
  AttentionBackwardCall backward(bool with_dlse = false) const {
    const auto lse_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor out = meta({batch, tq, hq, dv}, dtype);
    return attn_ops::prepare_attention_backward(
        meta({batch, tq, hq, dv}, dtype), meta({batch, tq, hq, dqk}, dtype), meta({batch, tk, hkv, dqk}, dtype),
        meta({batch, tk, hkv, dv}, dtype), out, meta({batch, hq, tq}, lse_dtype),
        with_dlse ? std::optional(meta({batch, hq, tq}, lse_dtype)) : std::nullopt, std::nullopt, causal, window_left,
        -1, softcap, std::nullopt, std::nullopt, std::nullopt, std::nullopt, patterns);
  }
};

// attention_with_kvcache over a contiguous cache [B, 256, Hkv, D] or a paged one of `block` token blocks.
inline AttentionCall over_cache(int64_t tq, int64_t block = 0, bool leftpad = false) {
  const int64_t batch = 4, hkv = 2, dim = 128;
  const at::Tensor lens = meta({batch}, at::kInt);
  std::optional<at::Tensor> table;
  at::Tensor cache;
  if (block > 0) {
    table = meta({batch, 256 / block}, at::kInt);
    cache = meta({batch * 256 / block, block, hkv, dim});
  } else {
    cache = meta({batch, 256, hkv, dim});
  }
  KvCacheRows rows;
  if (leftpad) {
    rows.cache_leftpad = meta({batch}, at::kInt);
  }
  return attn_ops::prepare_attention_with_kvcache(meta({batch, tq, 8, dim}), cache, cache, lens, table,
                                                  std::nullopt, true, -1, -1, 0.0, rows, PatternOptions{});
}

}  // namespace attn_ops_test
