// The conversion of prepared attention calls into cuDNN's view (csrc/attention/cuda/cudnn_problem.h): dims in
// [batch, heads, seq, dim] order with our strides, windows as cuDNN's bottom-right band, caches' per-row lengths
// and page tables. Pure host code over meta tensors; the graph built from it is validated in the CUDA build
// (tests/test_cudnn_graphs.py).
#include "attention/cuda/cudnn_problem.h"
#include "meta_calls.h"

#include <gtest/gtest.h>

#include <cmath>

namespace attn_ops::cuda {
namespace {

using attn_ops_test::Dense;
using attn_ops_test::meta;
using attn_ops_test::over_cache;

TEST(CudnnProblem, DenseForwardLayoutsAndBand) {
  Dense d;
  d.window_left = 63;
  const AttentionCall call = d.forward();
  const SdpaProblem p =
      sdpa_forward_problem(call, meta({2, 128, 8, 128}), meta({2, 8, 128}, at::kFloat));
  EXPECT_FALSE(p.backward);
  EXPECT_TRUE(p.bf16);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.heads_q, 8);
  EXPECT_EQ(p.heads_kv, 2);
  EXPECT_EQ(p.seqlen_q, 128);
  EXPECT_EQ(p.seqlen_k, 128);
  EXPECT_DOUBLE_EQ(p.scale, 1.0 / std::sqrt(128.0));
  // q [2, 128, 8, 128] contiguous: as [B, H, S, D] the strides of (b, h, s, d) are (128 * 8 * 128, 128, 1024, 1)
  EXPECT_EQ(p.q, (SdpaTensor{{2, 8, 128, 128}, {131072, 128, 1024, 1}}));
  EXPECT_EQ(p.k, (SdpaTensor{{2, 2, 128, 128}, {32768, 128, 256, 1}}));
  EXPECT_EQ(p.o, p.q);
  EXPECT_EQ(p.stats, (SdpaTensor{{2, 8, 128, 1}, {1024, 128, 1, 1}}));
  // window_left 63: 64 visible keys counting the query's own; causal: right bound 0
  EXPECT_EQ(p.left_bound, std::optional<int64_t>(64));
  EXPECT_EQ(p.right_bound, std::optional<int64_t>(0));
  EXPECT_FALSE(p.padding_mask);
  EXPECT_FALSE(p.paged);
}

TEST(CudnnProblem, StridedViewsKeepTheirStrides) {
  // q as the [B, S, H, D] view of a [B, H, S, D] tensor (HF's layout): cuDNN reads it in place
  const at::Tensor q = meta({2, 8, 64, 64}, at::kHalf).transpose(1, 2);
  const at::Tensor kv = meta({2, 2, 64, 64}, at::kHalf).transpose(1, 2);
  const AttentionCall call = prepare_attention(q, kv, kv, 0.5, false, -1, 7, 0.0, std::nullopt, std::nullopt,
                                               std::nullopt, std::nullopt, PatternOptions{});
  const SdpaProblem p = sdpa_forward_problem(call, meta({2, 64, 8, 64}, at::kHalf), meta({2, 8, 64}, at::kFloat));
  EXPECT_FALSE(p.bf16);
  EXPECT_EQ(p.q, (SdpaTensor{{2, 8, 64, 64}, {8 * 64 * 64, 64 * 64, 64, 1}}));
  EXPECT_EQ(p.k, (SdpaTensor{{2, 2, 64, 64}, {2 * 64 * 64, 64 * 64, 64, 1}}));
  EXPECT_DOUBLE_EQ(p.scale, 0.5);
  EXPECT_FALSE(p.left_bound.has_value());
  EXPECT_EQ(p.right_bound, std::optional<int64_t>(7));  // not causal: window_right
}

TEST(CudnnProblem, CacheForwards) {
  // contiguous cache, chunked prefill of 4 queries: padding mask, causal band kept
  SdpaProblem p = sdpa_forward_problem(over_cache(4), meta({4, 4, 8, 128}), meta({4, 8, 4}, at::kFloat));
  EXPECT_TRUE(p.padding_mask);
  EXPECT_FALSE(p.paged);
  EXPECT_EQ(p.seqlen_k, 256);
  EXPECT_EQ(p.k, (SdpaTensor{{4, 2, 256, 128}, {65536, 128, 256, 1}}));
  EXPECT_EQ(p.right_bound, std::optional<int64_t>(0));
  // decode: no causal bound sent
  p = sdpa_forward_problem(over_cache(1), meta({4, 1, 8, 128}), meta({4, 8, 1}, at::kFloat));
  EXPECT_FALSE(p.right_bound.has_value());
  // paged, blocks of 16: the pool [64, 16, 2, 128] as [64, 2, 16, 128], the table [4, 16] as [4, 1, 16, 1]
  p = sdpa_forward_problem(over_cache(1, 16), meta({4, 1, 8, 128}), meta({4, 8, 1}, at::kFloat));
  EXPECT_TRUE(p.paged);
  EXPECT_EQ(p.block_size, 16);
  EXPECT_EQ(p.seqlen_k, 256);  // max_blocks_per_seq * block_size
  EXPECT_EQ(p.k, (SdpaTensor{{64, 2, 16, 128}, {4096, 128, 256, 1}}));
  EXPECT_EQ(p.page_table, (SdpaTensor{{4, 1, 16, 1}, {16, 16, 1, 1}}));
}

TEST(CudnnProblem, Backward) {
  Dense d;
  d.dqk = 192;
  d.tq = 64;
  // the gradients as the op allocates them, contiguous like q, k, v
  const SdpaProblem p = sdpa_backward_problem(d.backward(), meta({2, 64, 8, 192}), meta({2, 128, 2, 192}),
                                              meta({2, 128, 2, 128}));
  EXPECT_TRUE(p.backward);
  EXPECT_EQ(p.dim_qk, 192);
  EXPECT_EQ(p.dim_v, 128);
  EXPECT_EQ(p.dout, (SdpaTensor{{2, 8, 64, 128}, {65536, 128, 1024, 1}}));
  EXPECT_EQ(p.o, p.dout);
  EXPECT_EQ(p.stats, (SdpaTensor{{2, 8, 64, 1}, {512, 64, 1, 1}}));
  EXPECT_EQ(p.dq, p.q);
  EXPECT_EQ(p.dk, (SdpaTensor{{2, 2, 128, 192}, {49152, 192, 384, 1}}));
  EXPECT_EQ(p.dv, p.v);
  EXPECT_EQ(p.right_bound, std::optional<int64_t>(0));
}

}  // namespace
}  // namespace attn_ops::cuda
