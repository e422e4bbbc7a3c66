// The device-side value checks of index tensors (index_checks.h): one block per check scans the values,
// finds the first bad one (the one the host check would name), and its thread 0 prints the host check's
// message and fails a device-side assert.
#include "common/cuda/index_checks.h"

#include "common/cuda/device_utils.cuh"

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstdio>
#include <cstring>

namespace attn_ops::cuda {
namespace {

constexpr int kCheckThreads = 256;

// A message fragment (op or argument name) passed by value in the kernel's arguments: no host-to-device
// copy, which for pageable memory would synchronise.
struct Text {
  char s[48];
};

Text text(const char* s) {
  Text t{};
  std::strncpy(t.s, s, sizeof(t.s) - 1);
  return t;
}

// Scans values 0 .. check.n - 1; at the first one that is not check.ok(i), prints check.report(i) and
// fails a device-side assert.
template <typename Check>
__global__ void __launch_bounds__(kCheckThreads) check_values_kernel(const Check check) {
  __shared__ unsigned long long first_bad;
  if (threadIdx.x == 0) {
    first_bad = ULLONG_MAX;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < check.n; i += blockDim.x) {
    if (!check.ok(i)) {
      atomicMin(&first_bad, static_cast<unsigned long long>(i));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && first_bad != ULLONG_MAX) {
    check.report(static_cast<int64_t>(first_bad));
    // A device-side assert, as CUDA_KERNEL_ASSERT raises (called directly: it is not compiled out by
    // NDEBUG): the context ends, and the op's write kernels after this one never run.
    __assert_fail("index values in range (attn_ops: the message above)", __FILE__, __LINE__, __func__);
  }
}

template <typename Check>
void launch_check(const Check& check) {
  if (check.n == 0) {
    return;
  }
  check_values_kernel<Check><<<1, kCheckThreads, 0, at::cuda::getCurrentCUDAStream()>>>(check);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The first e < b with values[e] == values[b], else -1 (a repeated cache row or state slot).
__device__ int64_t first_equal(const int32_t* values, int64_t b) {
  for (int64_t e = 0; e < b; ++e) {
    if (values[e] == values[b]) {
      return e;
    }
  }
  return -1;
}

// Element i = (row b, block j) of cache_seqlens and block_table (width 1 without a table).
struct CacheLengthCheck {
  Text op;
  const int32_t* lens;        // [batch]
  const int32_t* table;       // [table rows, width] contiguous, or null (not paged, or no blocks per row)
  const int32_t* table_rows;  // [batch] block-table row of each row (cache_batch_idx, checked), or null: b
  const int32_t* first_key;   // [batch] first key position (cache_leftpad, checked), or null: 0
  int64_t n, width, capacity, block_size, num_blocks;
  int64_t max_blocks_per_seq;  // the table's width as given (width is at least 1)
  bool paged;

  __device__ bool len_ok(int64_t b) const { return lens[b] >= 0 && lens[b] <= capacity; }
  __device__ int64_t table_row(int64_t b) const { return table_rows != nullptr ? table_rows[b] : b; }
  __device__ bool ok(int64_t i) const {
    const int64_t b = i / width, j = i % width;
    if (!len_ok(b)) {
      return j != 0;  // reported once, at the row's first element
    }
    const int64_t first = first_key != nullptr ? first_key[b] : 0;
    if (table == nullptr || j * block_size >= lens[b] || (j + 1) * block_size <= first) {
      return true;
    }
    const int32_t block = table[table_row(b) * width + j];
    return block >= 0 && block < num_blocks;
  }
  __device__ void report(int64_t i) const {
    const int64_t b = i / width, j = i % width;
    const long long len = lens[b];
    if (len < 0) {
      printf("%s: cache_seqlens[%lld] = %lld must be >= 0\n", op.s, (long long)b, len);
    } else if (len > capacity && !paged) {
      printf("%s: cache_seqlens[%lld] = %lld exceeds the cache capacity %lld\n", op.s, (long long)b, len,
             (long long)capacity);
    } else if (len > capacity) {
      printf("%s: cache_seqlens[%lld] = %lld exceeds the cache capacity %lld (max_blocks_per_seq %lld x block_size "
             "%lld)\n",
             op.s, (long long)b, len, (long long)capacity, (long long)max_blocks_per_seq, (long long)block_size);
    } else {
      const int64_t t = table_row(b);
      printf("%s: block_table[%lld, %lld] = %d is out of range [0, %lld)\n", op.s, (long long)t, (long long)j,
             table[t * width + j], (long long)num_blocks);
    }
  }
};

// Elements 0 .. batch - 1: cache_batch_idx[b] in [0, rows); then, when distinct, elements batch + b: no
// earlier row with the same value (every range error first, as the host check reports them).
struct BatchIdxCheck {
  Text op, rows_name;
  const int32_t* idx;  // [batch]
  int64_t n, batch, rows;

  __device__ bool ok(int64_t i) const {
    return i < batch ? idx[i] >= 0 && idx[i] < rows : first_equal(idx, i - batch) < 0;
  }
  __device__ void report(int64_t i) const {
    if (i < batch) {
      printf("%s: cache_batch_idx[%lld] = %d is out of range [0, %lld) (the rows of %s)\n", op.s, (long long)i, idx[i],
             (long long)rows, rows_name.s);
    } else {
      const int64_t b = i - batch;
      printf("%s: cache_batch_idx[%lld] = %d repeats cache_batch_idx[%lld]: the rows of one write must be distinct "
             "cache rows\n",
             op.s, (long long)b, idx[b], (long long)first_equal(idx, b));
    }
  }
};

struct LeftpadCheck {
  Text op;
  const int32_t* pad;   // [batch]
  const int32_t* lens;  // [batch]
  int64_t n;

  __device__ bool ok(int64_t b) const { return pad[b] >= 0 && pad[b] <= lens[b]; }
  __device__ void report(int64_t b) const {
    const long long r = b;
    if (pad[b] < 0) {
      printf("%s: cache_leftpad[%lld] = %d must be >= 0\n", op.s, r, pad[b]);
    } else {
      printf("%s: cache_leftpad[%lld] = %d exceeds cache_seqlens[%lld] = %d (the keys of row %lld are cache positions "
             "cache_leftpad[%lld] .. cache_seqlens[%lld] - 1)\n",
             op.s, r, pad[b], r, lens[b], r, r, r);
    }
  }
};

struct AppendLengthCheck {
  Text op;
  const int32_t* lens;  // [batch]
  int64_t n, added, capacity;

  __device__ bool ok(int64_t b) const { return lens[b] >= 0 && lens[b] + added <= capacity; }
  __device__ void report(int64_t b) const {
    if (lens[b] < 0) {
      printf("%s: cache_seqlens[%lld] = %d must be >= 0\n", op.s, (long long)b, lens[b]);
    } else {
      printf("%s: cache_seqlens[%lld] = %d plus %lld new tokens exceeds the cache capacity %lld\n", op.s,
             (long long)b, lens[b], (long long)added, (long long)capacity);
    }
  }
};

template <typename I>
struct SlotCheck {
  Text op;
  const I* slots;  // [num_tokens]
  int64_t n, num_blocks, block_size;

  __device__ bool ok(int64_t i) const { return slots[i] >= -1 && slots[i] < num_blocks * block_size; }
  __device__ void report(int64_t i) const {
    printf("%s: slot_mapping[%lld] = %lld is out of range: the cache has %lld slots (num_blocks %lld x block_size "
           "%lld); -1 skips a token\n",
           op.s, (long long)i, (long long)slots[i], (long long)(num_blocks * block_size), (long long)num_blocks,
           (long long)block_size);
  }
};

constexpr int kMaxPositionDims = 8;

template <typename I>
struct PositionCheck {
  Text op;
  const I* positions;  // contiguous, sizes[0 .. dims)
  int64_t n, max_positions;
  int64_t sizes[kMaxPositionDims];
  int dims;

  __device__ bool ok(int64_t i) const { return positions[i] >= 0 && positions[i] < max_positions; }
  // positions[i0, i1, ...] = v: the multi-index, as the host check names it.
  __device__ void report(int64_t i) const {
    int64_t index[kMaxPositionDims];
    int64_t rest = i;
    for (int d = dims - 1; d >= 0; --d) {
      index[d] = rest % sizes[d];
      rest /= sizes[d];
    }
    printf("%s: positions[", op.s);
    for (int d = 0; d < dims; ++d) {
      printf(d == 0 ? "%lld" : ", %lld", (long long)index[d]);
    }
    printf("] = %lld is out of range [0, %lld) of the cos/sin table\n", (long long)positions[i],
           (long long)max_positions);
  }
};

// lightning_attention_decode_'s state_indices [batch]: each in [-1, num_slots), and no slot >= 0 named twice
// (two rows would update one state). Element b fails at the first of the two, as the host check's loop.
struct StateIndexCheck {
  Text op;
  const int32_t* idx;  // [batch]
  int64_t n, num_slots;

  __device__ bool in_range(int64_t b) const { return idx[b] >= -1 && idx[b] < num_slots; }
  __device__ bool ok(int64_t b) const { return in_range(b) && (idx[b] < 0 || first_equal(idx, b) < 0); }
  __device__ void report(int64_t b) const {
    if (!in_range(b)) {
      printf("%s: state_indices[%lld] = %d is out of range [-1, %lld) of the state pool; -1 skips a row\n", op.s,
             (long long)b, idx[b], (long long)num_slots);
    } else {
      printf("%s: state_indices[%lld] = %d repeats state_indices[%lld]: two rows cannot update one slot\n", op.s,
             (long long)b, idx[b], (long long)first_equal(idx, b));
    }
  }
};

// lightning attention's slope [heads] float32: finite and >= 0 (a decay rate).
struct SlopeCheck {
  Text op;
  const float* slope;  // [heads]
  int64_t n;

  __device__ bool ok(int64_t h) const { return isfinite(slope[h]) && slope[h] >= 0.0f; }
  __device__ void report(int64_t h) const {
    printf("%s: slope[%lld] = %g must be finite and >= 0\n", op.s, (long long)h, (double)slope[h]);
  }
};

struct CuSeqlensCheck {
  Text op, name, tensor_name, max_name;
  const int32_t* cu;  // [batch + 1]
  int64_t n, total, max_seqlen;  // max_seqlen < 0: not given

  __device__ bool ok(int64_t i) const {
    if (i == 0) {
      return cu[0] == 0 && (n > 1 || cu[0] == total);
    }
    const int64_t len = int64_t(cu[i]) - cu[i - 1];
    return len >= 0 && (max_seqlen < 0 || len <= max_seqlen) && (i != n - 1 || cu[i] == total);
  }
  // The host check's message: its checks in its order (start, order, end, then the longest sequence).
  __device__ void report(int64_t) const {
    if (cu[0] != 0) {
      printf("%s: %s must start at 0, got %d\n", op.s, name.s, cu[0]);
      return;
    }
    int64_t longest = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (cu[i] < cu[i - 1]) {
        printf("%s: %s must be non-decreasing, got %s[%lld] = %d after %s[%lld] = %d\n", op.s, name.s, name.s,
               (long long)i, cu[i], name.s, (long long)(i - 1), cu[i - 1]);
        return;
      }
      longest = max(longest, int64_t(cu[i]) - cu[i - 1]);
    }
    if (cu[n - 1] != total) {
      printf("%s: %s must end at the number of tokens in %s (%lld), got %d\n", op.s, name.s, tensor_name.s,
             (long long)total, cu[n - 1]);
      return;
    }
    printf("%s: %s (%lld) is smaller than the longest sequence in %s (%lld)\n", op.s, max_name.s,
           (long long)max_seqlen, name.s, (long long)longest);
  }
};

}  // namespace

bool device_checks_enabled() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
}

void check_cache_lengths_and_blocks_on_device(const char* op, const at::Tensor& cache_seqlens,
                                              const at::Tensor& block_table, int64_t capacity, int64_t block_size,
                                              int64_t num_blocks, const at::Tensor& table_rows,
                                              const at::Tensor& first_key) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor lens = cache_seqlens.contiguous();
  const at::Tensor table = block_table.defined() ? block_table.contiguous() : at::Tensor();
  const int64_t width = table.defined() ? std::max<int64_t>(table.size(1), 1) : 1;  // >= 1: row b's lengths
  const int32_t* entries = table.defined() && table.size(1) > 0 ? table.const_data_ptr<int32_t>() : nullptr;
  const at::Tensor rows = table_rows.defined() ? table_rows.contiguous() : at::Tensor();
  const at::Tensor first = first_key.defined() ? first_key.contiguous() : at::Tensor();
  launch_check(CacheLengthCheck{text(op), lens.const_data_ptr<int32_t>(), entries,
                                rows.defined() ? rows.const_data_ptr<int32_t>() : nullptr,
                                first.defined() ? first.const_data_ptr<int32_t>() : nullptr, lens.numel() * width,
                                width, capacity, block_size, num_blocks, table.defined() ? table.size(1) : 0,
                                table.defined()});
}

void check_batch_idx_on_device(const char* op, const at::Tensor& cache_batch_idx, int64_t rows, const char* rows_name,
                               bool distinct) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor idx = cache_batch_idx.contiguous();
  const int64_t batch = idx.numel();
  launch_check(BatchIdxCheck{text(op), text(rows_name), idx.const_data_ptr<int32_t>(), distinct ? 2 * batch : batch,
                             batch, rows});
}

void check_leftpad_on_device(const char* op, const at::Tensor& cache_leftpad, const at::Tensor& cache_seqlens) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor pad = cache_leftpad.contiguous();
  const at::Tensor lens = cache_seqlens.contiguous();
  launch_check(LeftpadCheck{text(op), pad.const_data_ptr<int32_t>(), lens.const_data_ptr<int32_t>(), pad.numel()});
}

void check_append_lengths_on_device(const char* op, const at::Tensor& cache_seqlens, int64_t added,
                                    int64_t capacity) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor lens = cache_seqlens.contiguous();
  launch_check(AppendLengthCheck{text(op), lens.const_data_ptr<int32_t>(), lens.numel(), added, capacity});
}

void check_slot_values_on_device(const char* op, const at::Tensor& slot_mapping, int64_t num_blocks,
                                 int64_t block_size) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor slots = slot_mapping.contiguous();
  with_index_data(slots, [&](const auto* data) {
    using I = pointee_t<decltype(data)>;
    launch_check(SlotCheck<I>{text(op), data, slots.numel(), num_blocks, block_size});
  });
}

void check_positions_on_device(const char* op, const at::Tensor& positions, int64_t max_positions) {
  if (!device_checks_enabled()) {
    return;
  }
  TORCH_INTERNAL_ASSERT(positions.dim() <= kMaxPositionDims, op, ": positions has more than ", kMaxPositionDims,
                        " dims");
  const at::Tensor pos = positions.contiguous();
  with_index_data(pos, [&](const auto* data) {
    using I = pointee_t<decltype(data)>;
    PositionCheck<I> check{text(op), data, pos.numel(), max_positions, {}, static_cast<int>(pos.dim())};
    for (int64_t d = 0; d < pos.dim(); ++d) {
      check.sizes[d] = pos.size(d);
    }
    launch_check(check);
  });
}

void check_cu_seqlens_on_device(const char* op, const char* name, const at::Tensor& cu_seqlens, int64_t total,
                                const char* tensor_name, int64_t max_seqlen, const char* max_name) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor cu = cu_seqlens.contiguous();
  launch_check(CuSeqlensCheck{text(op), text(name), text(tensor_name), text(max_name), cu.const_data_ptr<int32_t>(),
                              cu.numel(), total, max_seqlen});
}

void check_state_indices_on_device(const char* op, const at::Tensor& state_indices, int64_t num_slots) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor idx = state_indices.contiguous();
  launch_check(StateIndexCheck{text(op), idx.const_data_ptr<int32_t>(), idx.numel(), num_slots});
}

void check_slope_on_device(const char* op, const at::Tensor& slope) {
  if (!device_checks_enabled()) {
    return;
  }
  const at::Tensor s = slope.contiguous();
  launch_check(SlopeCheck{text(op), s.const_data_ptr<float>(), s.numel()});
}

}  // namespace attn_ops::cuda
