// Preparation of the attention ops (attention, attention_backward, attention_with_kvcache), shared by every
// backend: one function per op validates every argument, resolves the defaults and sizes the outputs into the
// AttentionCall (common/attention_call.h) that the backends take. The Meta, CPU and CUDA kernels all call it
// first, so all backends reject the same inputs with the same message, and a fake-tensor trace rejects them
// too. Sizes are SymInts so the Meta kernels work under torch.compile's dynamic shapes.
#pragma once

#include "common/attention_call.h"
#include "common/serving.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace attn_ops {

// attention: checks q, k, v and the options (values of cu_seqlens when they hold data); throws c10::Error
// naming the argument, what was expected and what came.
AttentionCall prepare_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                                const std::optional<at::Tensor>& cu_seqlens_k, std::optional<int64_t> max_seqlen_q,
                                std::optional<int64_t> max_seqlen_k, const PatternOptions& patterns);

// attention_backward: the forward's checks, plus dout and out (out's shape, q's dtype), lse and dlse (lse's
// shape and dtype); `deterministic` also when torch.are_deterministic_algorithms_enabled().
AttentionBackwardCall prepare_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                 const std::optional<at::Tensor>& dlse, std::optional<double> scale,
                                                 bool causal, int64_t window_left, int64_t window_right,
                                                 double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                                                 const std::optional<at::Tensor>& cu_seqlens_k,
                                                 std::optional<int64_t> max_seqlen_q,
                                                 std::optional<int64_t> max_seqlen_k, const PatternOptions& patterns,
                                                 bool deterministic = false);

// attention_with_kvcache: q [B, Tq, Hq, D] (or packed [total_q, Hq, D] with cu_seqlens_q) over a contiguous
// cache [B, capacity, Hkv, D] or, with block_table [B, max_blocks_per_seq], a paged one
// [num_blocks, block_size, Hkv, D] (with cache_batch_idx, any number of cache / block-table rows); values of
// cache_seqlens / block_table checked when they hold data; num_splits >= 0.
AttentionCall prepare_attention_with_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                                             const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                             const std::optional<at::Tensor>& block_table, std::optional<double> scale,
                                             bool causal, int64_t window_left, int64_t window_right, double softcap,
                                             const KvCacheRows& rows, const PatternOptions& patterns,
                                             int64_t num_splits = 0, const CacheScales& scales = {});

// Empty (dq, dk, dv) shaped as (q, k, v) (Meta tensors too).
std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_attention_grads(const at::Tensor& q, const at::Tensor& k,
                                                                     const at::Tensor& v);

}  // namespace attn_ops
