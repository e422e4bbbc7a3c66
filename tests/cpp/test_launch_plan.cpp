// The host-side launch decisions of the CUDA attention kernels (csrc/attention/cuda/launch_plan.h): plain
// functions of sizes, so they are tested here without a GPU.
#include "attention/cuda/launch_plan.h"

#include <gtest/gtest.h>

namespace attn_ops::cuda {
namespace {

constexpr int64_t kH100Sms = 132;

TEST(LaunchPlan, SplitMinKeysFollowsPartialTraffic) {
  // GQA 32/8 decode, bf16 D=128: 4 rows of partials per KV head are cheap, the 256-key floor holds.
  EXPECT_EQ(split_min_keys(4, 128, 128, 2), 256);
  // MLA 576/512 with 128 heads: 2 x 128 x 513 x 4 bytes of partials per split vs 2176 bytes per key.
  EXPECT_EQ(split_min_keys(128, 576, 512, 2), 1024);
  // Always a multiple of the split tile.
  for (int64_t rows : {1, 3, 17, 64, 200}) {
    EXPECT_EQ(split_min_keys(rows, 192, 128, 2) % kSplitTile, 0);
  }
}

TEST(LaunchPlan, MaxKeySplits) {
  // Enough items already: no split.
  EXPECT_EQ(max_key_splits(2 * kH100Sms, kH100Sms, 1 << 15, 256), 1);
  // Short rows: no split.
  EXPECT_EQ(max_key_splits(8, kH100Sms, 512, 256), 1);
  // B=1 Hkv=8 decode in a 32k cache: the GPU-filling count, 33.
  EXPECT_EQ(max_key_splits(8, kH100Sms, 32768, 256), 33);
  // Capped by the minimum split length and by 64.
  EXPECT_EQ(max_key_splits(1, kH100Sms, 4096, 1024), 4);
  EXPECT_EQ(max_key_splits(1, kH100Sms, 1 << 20, 256), 64);
}

TEST(LaunchPlan, QueryHeadSplits) {
  EXPECT_EQ(query_head_splits(256, 32, kH100Sms), 2);   // MQA, 16k tokens: 256 blocks < 2 x 132
  EXPECT_EQ(query_head_splits(4, 32, kH100Sms), 32);    // capped by the group
  EXPECT_EQ(query_head_splits(100, 8, kH100Sms), 3);
  EXPECT_EQ(query_head_splits(8192, 32, kH100Sms), 1);  // the key tiles fill the GPU
  EXPECT_EQ(query_head_splits(4, 1, kH100Sms), 1);      // MHA: nothing to split
}

}  // namespace
}  // namespace attn_ops::cuda
