// Register-blocked float32 tile products for the prefill forward (forward_tiles.h), per instruction set
// (compiled into each copy in the inline namespace CPU_CAPABILITY, as at::vec).
//
// Why not MKL: the forward's products are small (a [256, 128] x [128, 256] score tile, a [256, 256] x
// [256, 128] P V tile) and sgemm packs its operands on every call. Here the right-hand operand comes
// pre-arranged in panels of kPanelWidth columns (K^T and V, packed once per call and shared by every query
// tile and every query head of the KV group: panel_kv.h) and the left-hand one is read in place, one
// element at a time, broadcast into the FMA. A kPanelRows x kPanelWidth block of C stays in registers for the whole
// reduction: 14 x 32 floats = 28 zmm on AVX-512 (6 x 16 = 12 ymm on AVX2), two loads of B and one broadcast
// per two FMAs per row.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>

namespace attn_ops::cpu {
inline namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool kPanelGemm = true;  // the portable copy keeps MKL (at::vec's scalar emulation is slower)
#else
constexpr bool kPanelGemm = false;
#endif
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kPanelRows = 14;  // 28 accumulators + 2 B vectors + 1 broadcast of the 32 zmm registers
#else
constexpr int kPanelRows = 6;  // 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers
#endif
constexpr int64_t kPanelWidth = 2 * at::vec::Vectorized<float>::size();

// C[MR, kPanelWidth] (row stride ldc) = alpha * A B, or C += A B when accumulate (alpha unused then);
// A [MR, k] row-major (row stride lda), B [k, kPanelWidth] (row stride ldb).
template <int MR, bool accumulate>
inline void panel_tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                       float alpha) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t W = V::size();
  V acc[MR][2];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = accumulate ? V::loadu(c + r * ldc) : V(0.f);
    acc[r][1] = accumulate ? V::loadu(c + r * ldc + W) : V(0.f);
  }
  for (int64_t i = 0; i < k; ++i) {
    const V b0 = V::loadu(b + i * ldb), b1 = V::loadu(b + i * ldb + W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V ar(a[r * lda + i]);
      acc[r][0] = at::vec::fmadd(ar, b0, acc[r][0]);
      acc[r][1] = at::vec::fmadd(ar, b1, acc[r][1]);
    }
  }
  const V valpha(alpha);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    (accumulate ? acc[r][0] : acc[r][0] * valpha).store(c + r * ldc);
    (accumulate ? acc[r][1] : acc[r][1] * valpha).store(c + r * ldc + W);
  }
}

// panel_tile for any row count 1 <= rows <= kPanelRows (the last row block of a tile).
template <bool accumulate, int MR = kPanelRows>
inline void panel_tile_rows(int64_t rows, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                            float* c, int64_t ldc, float alpha) {
  if constexpr (MR > 0) {
    if (rows == MR) {
      panel_tile<MR, accumulate>(k, a, lda, b, ldb, c, ldc, alpha);
    } else {
      panel_tile_rows<accumulate, MR - 1>(rows, k, a, lda, b, ldb, c, ldc, alpha);
    }
  }
}

// C[m, panels * kPanelWidth] (row stride ldc) = alpha * A B, or C += A B when accumulate; A [m, k] row-major
// (row stride lda), B given as `panels` column panels [k, kPanelWidth] (row stride ldb) of which panel j
// starts at b + j * panel_stride. Panel-outer: one panel of B stays in L1 while every row block of A
// streams past it.
template <bool accumulate>
inline void panel_gemm(int64_t m, int64_t panels, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, int64_t panel_stride, float* c, int64_t ldc, float alpha) {
  for (int64_t j = 0; j < panels; ++j) {
    const float* bj = b + j * panel_stride;
    float* cj = c + j * kPanelWidth;
    int64_t r = 0;
    for (; r + kPanelRows <= m; r += kPanelRows) {
      panel_tile<kPanelRows, accumulate>(k, a + r * lda, lda, bj, ldb, cj + r * ldc, ldc, alpha);
    }
    if (r < m) {
      panel_tile_rows<accumulate>(m - r, k, a + r * lda, lda, bj, ldb, cj + r * ldc, ldc, alpha);
    }
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu
