// A prepared attention call as cuDNN's fused attention sees it: every tensor in cuDNN's [batch, heads, seq, dim]
// order with our strides, the mask as cuDNN's bottom-right diagonal band, the per-row lengths and page table of a
// cache. A pure function of the call (no cuDNN types), so the conversion is compiled into every build and tested
// without a GPU (tests/cpp/test_cudnn_problem.cpp); attention/cuda/cudnn_graph.* builds the graph from it.
#pragma once

#include "common/attention_call.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace attn_ops::cuda {

// One tensor of the graph: dims and strides in cuDNN's order.
struct SdpaTensor {
  std::vector<int64_t> dims, strides;
  bool operator==(const SdpaTensor&) const = default;
};

struct SdpaProblem {
  bool backward = false;
  bool bf16 = true;  // else float16
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, dim_qk = 0, dim_v = 0;
  double scale = 1.0;
  // The diagonal band, bottom-right aligned: key j visible to query i iff
  //   j > i + (s_kv - s_q) - left_bound (when set) and j <= i + (s_kv - s_q) + right_bound (when set);
  // our window_left W is left_bound W + 1 (cuDNN counts the visible keys, the query's own included).
  std::optional<int64_t> left_bound, right_bound;
  // q, k, v, o [B, H, S, D]; stats (lse, natural log, float32) [B, Hq, Sq, 1]; backward: dO like o, and the
  // gradients dq, dk, dv like q, k, v. Paged: k and v are the block pools [num_blocks, Hkv, block_size, D].
  SdpaTensor q, k, v, o, stats, dout, dq, dk, dv;
  // Over a cache: per-row lengths (seq_len_q = Sq, seq_len_kv = cache_seqlens) turn on cuDNN's padding mask.
  bool padding_mask = false;
  // Paged: the block table as cuDNN's [B, 1, blocks_per_row, 1] (the same table for K and V).
  bool paged = false;
  int64_t block_size = 0;
  SdpaTensor page_table;

  bool operator==(const SdpaProblem&) const = default;
};

// The problem of a forward (dense, or over a contiguous or paged cache) the router sent to cuDNN: out and lse
// are the op's outputs ([B, Tq, Hq, Dv], [B, Hq, Tq]).
SdpaProblem sdpa_forward_problem(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse);

// The problem of a dense backward: the call's dout, out and lse, and the gradients dq, dk, dv it writes.
SdpaProblem sdpa_backward_problem(const AttentionBackwardCall& call, const at::Tensor& dq, const at::Tensor& dk,
                                  const at::Tensor& dv);

}  // namespace attn_ops::cuda
