// The ALiBi bias of one query row over a tile of keys, as the CPU kernels pass it to the softmax (row_ops.h).
#pragma once

#include <cstdint>

namespace attn_ops::cpu {

// ALiBi over one row's tile of scores: score j of the tile gains -slope * |distance - j|, where distance is the
// query's position minus the tile's first key. slope 0: no bias.
struct AlibiRow {
  double slope = 0;
  int64_t distance = 0;
  // The same row over the scores from the tile's key `first` on.
  AlibiRow from(int64_t first) const { return {slope, distance - first}; }
};

}  // namespace attn_ops::cpu
