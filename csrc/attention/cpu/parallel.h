// Dynamic scheduling on top of at::parallel_for: the workers pull work items from a shared counter,
// so uneven items (causal masks, varlen sequences) balance across threads.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace attn_ops::cpu {

// Runs body(item, scratch) for item in [0, num_items); each worker builds its scratch once with make_scratch().
template <typename MakeScratch, typename Body>
void parallel_items(int64_t num_items, const MakeScratch& make_scratch, const Body& body) {
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), num_items);
  if (workers <= 0) {
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    auto scratch = make_scratch();
    for (int64_t item = next.fetch_add(1); item < num_items; item = next.fetch_add(1)) {
      body(item, scratch);
    }
  });
}

}  // namespace attn_ops::cpu
