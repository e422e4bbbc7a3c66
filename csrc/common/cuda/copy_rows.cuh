// Row copies into caches on the GPU: the building block of every CUDA cache write. A copy is exact in every
// dtype, so the kernel moves raw words: 16 bytes at a time when every row start is 16-byte aligned, else
// one element at a time.
//
// Offsets (element offsets of a row's destination and source, or false to skip the row) are computed on
// the device from cache_seqlens / cache_batch_idx / slot_mapping and bounds-checked there: under CUDA-graph capture the host
// cannot check those values, and a bad index then writes nothing.
#pragma once

#include "common/cuda/device_utils.cuh"

#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>

namespace attn_ops::cuda {

// Row (t, h) of new tokens [batch, added, heads, dim] goes to position cache_len[b] + t % added of cache
// row cache_row[b] (cache_batch_idx; without it, row b) of b = t / added, in a contiguous cache
// [rows, capacity, heads, dim]; a row b whose tokens do not all fit is not written at all, and a token that
// `superseded` marks (a higher batch row of the same cache row writes its position) is skipped.
struct AppendOffsets {
  const int32_t* cache_len;  // [batch]
  int64_t added, capacity;
  int64_t dst_batch, dst_token, dst_head;  // cache strides (elements)
  int64_t src_batch, src_token, src_head;  // new-token strides (elements)
  const int32_t* cache_row = nullptr;      // [batch] or null
  int64_t num_rows = 0;                    // cache rows (bound of cache_row)
  const bool* superseded = nullptr;        // [batch * added] or null (cache_cuda.cu marks it)

  __device__ __forceinline__ bool operator()(int64_t t, int64_t h, int64_t* dst, int64_t* src) const {
    const int64_t b = t / added, i = t % added;
    const int64_t row = static_cast<int64_t>(cache_len[b]) + i;
    const int64_t r = cache_row != nullptr ? static_cast<int64_t>(cache_row[b]) : b;
    // The whole row or nothing: a length that leaves no room for all `added` tokens skips every one of them
    // (only reachable under graph capture, where the value checks do not run; docs/cuda.md).
    if (cache_len[b] < 0 || cache_len[b] > capacity - added || r < 0 || (cache_row != nullptr && r >= num_rows) ||
        (superseded != nullptr && superseded[t])) {
      return false;
    }
    *dst = r * dst_batch + row * dst_token + h * dst_head;
    *src = b * src_batch + i * src_token + h * src_head;
    return true;
  }
};

// Row (t, h) of new tokens [num_tokens, heads, dim] goes to slot slot_mapping[t] of a paged cache
// [num_blocks, block_size, heads, dim]; slot -1 (or any slot out of range) skips the token.
template <typename Index>
struct SlotOffsets {
  const Index* slots;  // [num_tokens]
  int64_t num_slots, block_size;
  int64_t dst_block, dst_slot, dst_head;  // cache strides (elements)
  int64_t src_token, src_head;            // new-token strides (elements)

  __device__ __forceinline__ bool operator()(int64_t t, int64_t h, int64_t* dst, int64_t* src) const {
    const int64_t slot = static_cast<int64_t>(slots[t]);
    if (slot < 0 || slot >= num_slots) {
      return false;
    }
    *dst = (slot / block_size) * dst_block + (slot % block_size) * dst_slot + h * dst_head;
    *src = t * src_token + h * src_head;
    return true;
  }
};

// grid-stride over (token, head, word); Word is the unit copied (uint4 = 16 bytes, or the element).
template <typename Word, typename Offsets>
__global__ void copy_rows_kernel(char* dst, const char* src, int64_t tokens, int64_t heads, int64_t words_per_row,
                                 int64_t elem_size, Offsets offsets) {
  const int64_t total = tokens * heads * words_per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = idx % words_per_row, row = idx / words_per_row;
    int64_t dst_off, src_off;
    if (offsets(row / heads, row % heads, &dst_off, &src_off)) {
      reinterpret_cast<Word*>(dst + dst_off * elem_size)[w] = reinterpret_cast<const Word*>(src + src_off * elem_size)[w];
    }
  }
}

// Whether rows of `dim` elements of elem_size bytes can be copied 16 bytes at a time: the row is a
// multiple of 16 bytes, and so are both base addresses and every element stride of either side.
inline bool wide_rows(const void* dst, const void* src, int64_t dim, int64_t elem_size,
                      std::initializer_list<int64_t> strides) {
  const auto aligned = [](int64_t bytes) { return bytes % 16 == 0; };
  bool ok = aligned(reinterpret_cast<int64_t>(dst)) && aligned(reinterpret_cast<int64_t>(src)) &&
            aligned(dim * elem_size);
  for (const int64_t stride : strides) {
    ok = ok && aligned(stride * elem_size);
  }
  return ok;
}

// Copies `dim` elements of elem_size bytes for every (token, head) row that `offsets` maps; `wide`: every
// row start of both sides is 16-byte aligned and dim * elem_size is a multiple of 16.
template <typename Offsets>
void launch_copy_rows(void* dst, const void* src, int64_t tokens, int64_t heads, int64_t dim, int64_t elem_size,
                      bool wide, const Offsets& offsets) {
  if (tokens == 0 || heads == 0 || dim == 0) {
    return;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t words = wide ? dim * elem_size / 16 : dim;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div(tokens * heads * words, threads), 8 * int64_t(sm_count()));
  auto launch = [&](auto word) {
    using Word = decltype(word);
    copy_rows_kernel<Word, Offsets><<<blocks, threads, 0, stream>>>(
        static_cast<char*>(dst), static_cast<const char*>(src), tokens, heads, words, elem_size, offsets);
  };
  if (wide) {
    launch(uint4{});
  } else if (elem_size == 2) {
    launch(uint16_t{});
  } else if (elem_size == 4) {
    launch(uint32_t{});
  } else {
    TORCH_INTERNAL_ASSERT(elem_size == 8, "unexpected element size ", elem_size);
    launch(uint64_t{});
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace attn_ops::cuda
