// Dynamic scheduling on top of at::parallel_for: the workers pull work items from a shared counter,
// so uneven items (causal masks, varlen sequences) balance across threads. Calls below a minimum amount
// of work run on the calling thread: waking an OpenMP team costs tens of microseconds on an idle machine
// and milliseconds on a busy one, more than a small decode takes.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace attn_ops::cpu {

// Below this many floating-point operations (~50 us on one core) a call runs single-threaded.
constexpr double kMinParallelFlops = 2e6;

// The threads a call of `flops` operations gets: 1 below kMinParallelFlops, else all of at::get_num_threads().
inline int64_t parallel_threads(double flops) { return flops < kMinParallelFlops ? 1 : at::get_num_threads(); }

// Runs body(item, scratch) for item in [0, num_items), a call of `flops` operations in all; each worker
// builds its scratch once with make_scratch().
template <typename MakeScratch, typename Body>
void parallel_items(int64_t num_items, double flops, const MakeScratch& make_scratch, const Body& body) {
  const int64_t workers = std::min<int64_t>(parallel_threads(flops), num_items);
  if (workers <= 0) {
    return;
  }
  if (workers == 1) {  // no OpenMP team
    auto scratch = make_scratch();
    for (int64_t item = 0; item < num_items; ++item) {
      body(item, scratch);
    }
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
