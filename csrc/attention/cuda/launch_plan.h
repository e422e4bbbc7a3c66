// Host-side launch decisions of the CUDA attention kernels, as plain functions of sizes (no CUDA types):
// how many key splits a forward may use and how few keys a split may have, and over how many blocks the
// tensor-core backward spreads the query heads of a KV group.
#pragma once

#include <algorithm>
#include <cstdint>

namespace attn_ops::cuda {

// Split boundaries are multiples of this many keys: the largest key tile (kBlockN) of the forward kernels,
// so that no key tile is loaded by two splits.
constexpr int64_t kSplitTile = 64;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The fewest keys a split may have (a multiple of kSplitTile, at least 256): a split writes, and the merge
// reads, `rows` fp32 partial rows of dim_v + 1 values per KV head; that traffic must stay at most a quarter
// of the split's key traffic, (dim_qk + dim_v) * elem_bytes per key. MLA (128 rows of 512) thus needs
// ~1k keys per split, GQA decode (a few rows) 256.
inline int64_t split_min_keys(int64_t rows, int64_t dim_qk, int64_t dim_v, int64_t elem_bytes) {
  const int64_t partial_bytes = 2 * rows * (dim_v + 1) * 4;
  const int64_t key_bytes = std::max<int64_t>((dim_qk + dim_v) * elem_bytes, 1);
  return round_up(std::max<int64_t>(256, (4 * partial_bytes + key_bytes - 1) / key_bytes), kSplitTile);
}

// The most key splits of a forward launch (the grid's split dimension; a row uses fewer when its own keys
// are fewer, ForwardArgs::splits_used): enough (sequence, KV head, row tile) items x splits to fill the
// GPU's `sms` twice, no more than the longest possible row (`max_len_k`, e.g. a cache's capacity) has
// min_keys-key splits, and at most 64.
inline int64_t max_key_splits(int64_t items, int64_t sms, int64_t max_len_k, int64_t min_keys) {
  const int64_t target = 2 * sms;
  if (items <= 0 || items >= target || max_len_k <= 2 * min_keys) {
    return 1;
  }
  return std::clamp<int64_t>(std::min((target + items - 1) / items, (max_len_k + min_keys - 1) / min_keys), 1, 64);
}

// Keys of one block of the tensor-core backward (kBlockN of every backward tile).
constexpr int64_t kBackwardKeyTile = 64;

// Into how many blocks the tensor-core backward splits the `group` query heads of a KV head, given
// `blocks` (key tile, KV head, sequence) blocks: 1 when they already fill the GPU's `sms` twice, else
// enough to do so, at most `group`. More than 1 sums dK/dV by fp32 atomics.
inline int64_t query_head_splits(int64_t blocks, int64_t group, int64_t sms) {
  const int64_t target = 2 * sms;
  if (group <= 1 || blocks <= 0 || blocks >= target) {
    return 1;
  }
  return std::min(group, (target + blocks - 1) / blocks);
}

}  // namespace attn_ops::cuda
