// PTX wrappers and fragment helpers of the tensor-core attention kernels (forward_mma.cu, backward_mma.cu):
// 16-byte cp.async, ldmatrix, mma.sync m16n8k16 with fp32 accumulators (sm_80+), fp32 -> 16-bit packing;
// and the host checks their launchers share (tile choice, device limits, alignment).
#pragma once

#include "attention/cuda/problem.cuh"
#include "common/cuda/device_utils.cuh"

#include <cstdint>
#include <tuple>
#include <type_traits>

namespace attn_ops::cuda {

constexpr int kElemBytes = 2;  // float16 / bfloat16

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; with valid false it reads nothing and zero-fills the destination.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most the newest committed group is still in flight.
__device__ __forceinline__ void cp_async_wait_all_but_newest() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// Four 8x8 b16 matrices: lanes 8m .. 8m + 7 give the row addresses of matrix m, and r[m] of lane l holds
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (kTrans: rows 2 (l % 4), 2 (l % 4) + 1 of
// column l / 4).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
}

// d += A B for one m16n8k16 step, with g = lane / 4 and c = 2 (lane % 4):
//   a[0] = A[g][c, c+1]   a[1] = A[g+8][c, c+1]   a[2] = A[g][c+8, c+9]   a[3] = A[g+8][c+8, c+9]
//   b0 = B[c, c+1][g]     b1 = B[c+8, c+9][g]
//   d[0], d[1] = D[g][c, c+1]                     d[2], d[3] = D[g+8][c, c+1]
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T (to nearest even) in one register, `lo` in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, c10::Half>) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// Queues the copy of kRows rows of kCols elements into smem rows of kPitch elements at shared address dst:
// row r from src + offset(r), zero-filled when offset(r) < 0. The threads stride over 16-byte chunks.
template <typename T, int kRows, int kCols, int kPitch, int kThreads, typename F>
__device__ __forceinline__ void copy_tile(uint32_t dst, const T* src, F offset) {
  constexpr int kPerChunk = 16 / kElemBytes, kChunks = kCols / kPerChunk;  // elements / chunk, chunks / row
#pragma unroll
  for (int ch = threadIdx.x; ch < kRows * kChunks; ch += kThreads) {
    const int r = ch / kChunks, col = ch % kChunks * kPerChunk;
    const int64_t off = offset(r);
    cp_async_16(dst + (r * kPitch + col) * kElemBytes, off >= 0 ? src + off + col : src, off >= 0);
  }
}

// Calls f(tile) with the tile of the std::tuple Tiles whose kDqk and kDv are (dim_qk, dim_v); false when
// there is none.
template <typename Tiles, typename F>
bool with_tile(int64_t dim_qk, int64_t dim_v, F&& f) {
  return std::apply(
      [&](auto... tiles) {
        return ((decltype(tiles)::kDqk == dim_qk && decltype(tiles)::kDv == dim_v && (f(tiles), true)) || ...);
      },
      Tiles{});
}

// The current device is sm_80+ and gives a block `smem` bytes of dynamic shared memory.
inline bool mma_smem_fits(int64_t smem) {
  const cudaDeviceProp* device = at::cuda::getCurrentDeviceProperties();
  return device->major >= 8 && smem <= static_cast<int64_t>(device->sharedMemPerBlockOptin);
}

inline bool strides_divisible(const TokenLayout& x, int64_t n) {
  return x.batch_stride % n == 0 && x.token_stride % n == 0 && x.head_stride % n == 0;
}

inline bool pointer_aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace attn_ops::cuda
