// Register-blocked tile products for the prefill forward (forward_tiles.h), per instruction set (compiled into
// each copy in the inline namespace CPU_CAPABILITY, as at::vec): float32 (FloatPanel) and, on AVX512-BF16,
// bfloat16 pairs with float32 accumulation (Bf16PairPanel).
//
// Why not MKL: the forward's products are small (a [256, 128] x [128, 256] score tile, a [256, 256] x
// [256, 128] P V tile) and sgemm packs its operands on every call. Here the right-hand operand comes
// pre-arranged in panels of kPanelWidth columns (K^T and V, packed once per call and shared by every query
// tile and every query head of the KV group: panel_kv.h) and the left-hand one is read in place, one
// element (float32) or one pair (bfloat16) at a time, broadcast into the multiply-add. A kPanelRows x
// kPanelWidth block of C stays in registers for the whole reduction: 14 x 32 floats = 28 zmm on AVX-512
// (6 x 16 = 12 ymm on AVX2), two loads of B and one broadcast per two multiply-adds per row.
#pragma once

#include "common/cpu_isa.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

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

// C[MR, kPanelWidth] (row stride ldc) = alpha * A B, or C += A B when accumulate (alpha unused then), for
// a panel kind (FloatPanel, Bf16PairPanel): A [MR, steps * kStep] row-major (row stride lda) in a_t, B one
// panel of `steps` rows of kPanelWidth * kStep values (row stride ldb). A step is one broadcast of kStep
// values of an A row into one multiply-add per vector of the panel row.
template <typename Panel, int MR, bool accumulate>
inline void panel_tile(int64_t steps, const typename Panel::a_t* a, int64_t lda, const typename Panel::b_t* b,
                       int64_t ldb, float* c, int64_t ldc, float alpha) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t W = V::size();
  V acc[MR][2];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = accumulate ? V::loadu(c + r * ldc) : V(0.f);
    acc[r][1] = accumulate ? V::loadu(c + r * ldc + W) : V(0.f);
  }
  for (int64_t i = 0; i < steps; ++i) {
    const V b0 = Panel::load(b + i * ldb), b1 = Panel::load(b + i * ldb + W * Panel::kStep);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const typename Panel::a_t* ar = a + r * lda + i * Panel::kStep;
      acc[r][0] = Panel::multiply_add(ar, b0, acc[r][0]);
      acc[r][1] = Panel::multiply_add(ar, b1, acc[r][1]);
    }
  }
  const V valpha(alpha);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    (accumulate ? acc[r][0] : acc[r][0] * valpha).store(c + r * ldc);
    (accumulate ? acc[r][1] : acc[r][1] * valpha).store(c + r * ldc + W);
  }
}

// float32 panels: one value of A per step, B rows of kPanelWidth floats.
struct FloatPanel {
  using a_t = float;
  using b_t = float;
  static constexpr int64_t kStep = 1;
  static at::vec::Vectorized<float> load(const float* b) { return at::vec::Vectorized<float>::loadu(b); }
  static at::vec::Vectorized<float> multiply_add(const float* a, const at::vec::Vectorized<float>& b,
                                                 const at::vec::Vectorized<float>& acc) {
    return at::vec::fmadd(at::vec::Vectorized<float>(*a), b, acc);
  }
};

// bfloat16 pairs on AVX512-BF16 (only where cpu_has_avx512bf16()): a step is two adjacent values of an A row
// (one 32-bit broadcast) against a B row of kPanelWidth pairs [kPanelWidth][2], each lane's pair of
// products summed into its float32 lane by one vdpbf16ps: twice the products of an FMA per instruction (on
// Zen 4 at the FMA's rate). As inline assembly, like store_lowp, so the AVX-512 copy still loads on
// AVX-512 CPUs without AVX512-BF16. The A pair is broadcast into a register (a memory operand in the
// assembly made GCC keep the accumulators in memory, one store per instruction). The
// other copies have the layout (types, step) but no products (kBf16PairPanel false): the forward's code
// compiles in every copy and takes this path only in the AVX-512 one.
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
constexpr bool kBf16PairPanel = true;
#else
constexpr bool kBf16PairPanel = false;
#endif
// Whether this copy runs Bf16PairPanel's products on this CPU.
inline bool pair_products_available() { return kBf16PairPanel && cpu_has_avx512bf16(); }
struct Bf16PairPanel {
  using a_t = c10::BFloat16;
  using b_t = c10::BFloat16;
  static constexpr int64_t kStep = 2;
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
  static at::vec::Vectorized<float> load(const c10::BFloat16* b) { return _mm512_loadu_ps(b); }
  static at::vec::Vectorized<float> multiply_add(const c10::BFloat16* a, const at::vec::Vectorized<float>& b,
                                                 const at::vec::Vectorized<float>& acc) {
    uint32_t pair;
    std::memcpy(&pair, a, sizeof(pair));
    __m512 sum = acc;
    asm("vdpbf16ps %2, %1, %0" : "+v"(sum) : "v"(static_cast<__m512>(b)), "v"(_mm512_set1_epi32(pair)));
    return sum;
  }
  // The panels of an operand B given by its rows (row(j): a pointer to row j; a zero row after an odd last
  // one): `cols` columns (a multiple of kPanelWidth) in panels of kPanelWidth, panel c at dst + c *
  // panel_stride, its step s (rows 2s and 2s + 1 interleaved value by value, [kPanelWidth][2]) at + s *
  // step_stride; two permutes per step. Panel by panel, so that the stores run through memory in order
  // (step by step, every panel's store lands kilobytes from the last one, and they thrashed L1's sets).
  template <typename RowAt>
  static void pack_row_pairs(const RowAt& row, int64_t n, int64_t cols, c10::BFloat16* dst, int64_t panel_stride,
                             int64_t step_stride) {
    static_assert(kPanelWidth == 32);
    alignas(64) static constexpr uint16_t kLow[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i low = _mm512_load_si512(kLow), high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
    for (int64_t c = 0; c < cols; c += kPanelWidth, dst += panel_stride) {
      c10::BFloat16* step = dst;
      for (int64_t j = 0; j < n; j += 2, step += step_stride) {
        const __m512i x0 = _mm512_loadu_si512(row(j) + c);
        const __m512i x1 = j + 1 < n ? _mm512_loadu_si512(row(j + 1) + c) : _mm512_setzero_si512();
        _mm512_storeu_si512(step, _mm512_permutex2var_epi16(x0, low, x1));
        _mm512_storeu_si512(step + kPanelWidth, _mm512_permutex2var_epi16(x0, high, x1));
      }
    }
  }
#endif
};

// panel_tile for any row count 1 <= rows <= kPanelRows (the last row block of a tile).
template <typename Panel, bool accumulate, int MR = kPanelRows>
inline void panel_tile_rows(int64_t rows, int64_t steps, const typename Panel::a_t* a, int64_t lda,
                            const typename Panel::b_t* b, int64_t ldb, float* c, int64_t ldc, float alpha) {
  if constexpr (MR > 0) {
    if (rows == MR) {
      panel_tile<Panel, MR, accumulate>(steps, a, lda, b, ldb, c, ldc, alpha);
    } else {
      panel_tile_rows<Panel, accumulate, MR - 1>(rows, steps, a, lda, b, ldb, c, ldc, alpha);
    }
  }
}

// C[m, panels * kPanelWidth] (row stride ldc) = alpha * A B, or C += A B when accumulate; A [m, steps *
// kStep] row-major (row stride lda), B given as `panels` column panels of `steps` rows (row stride ldb) of
// which panel j starts at b + j * panel_stride (Panel: FloatPanel, the default, or Bf16PairPanel).
// Panel-outer: one panel of B stays in L1 while every row block of A streams past it.
template <bool accumulate, typename Panel = FloatPanel>
inline void panel_gemm(int64_t m, int64_t panels, int64_t steps, const typename Panel::a_t* a, int64_t lda,
                       const typename Panel::b_t* b, int64_t ldb, int64_t panel_stride, float* c, int64_t ldc,
                       float alpha) {
  for (int64_t j = 0; j < panels; ++j) {
    const typename Panel::b_t* bj = b + j * panel_stride;
    float* cj = c + j * kPanelWidth;
    int64_t r = 0;
    for (; r + kPanelRows <= m; r += kPanelRows) {
      panel_tile<Panel, kPanelRows, accumulate>(steps, a + r * lda, lda, bj, ldb, cj + r * ldc, ldc, alpha);
    }
    if (r < m) {
      panel_tile_rows<Panel, accumulate>(m - r, steps, a + r * lda, lda, bj, ldb, cj + r * ldc, ldc, alpha);
    }
  }
}

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
// brgemm's products (blas.h: lowp_brgemm, lowp_brgemm_pack) on bfloat16 pairs, for AVX512-BF16 CPUs without
// AMX: B is one block of kBrgemmBlock columns in brgemm's packed layout [k / 2][kBrgemmBlock][2], i.e. the
// two kPanelWidth-column panels of each step side by side.
constexpr int64_t kBrgemmBlock = 2 * kPanelWidth;

// C[m, kBrgemmBlock] (row stride ldc, float32) = (accumulate ? C : 0) + A[m, k] B; A row-major (row stride
// lda), B packed by pair_block_pack, k even.
inline void pair_block_product(int64_t m, int64_t k, const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b,
                               float* c, int64_t ldc, bool accumulate) {
  if (accumulate) {
    panel_gemm<true, Bf16PairPanel>(m, 2, k / 2, a, lda, b, 2 * kBrgemmBlock, kPanelWidth * 2, c, ldc, 1.f);
  } else {
    panel_gemm<false, Bf16PairPanel>(m, 2, k / 2, a, lda, b, 2 * kBrgemmBlock, kPanelWidth * 2, c, ldc, 1.f);
  }
}

// B[k, kBrgemmBlock] (row-major, row stride ld_in; k even) into brgemm's packed layout.
inline void pair_block_pack(int64_t k, int64_t ld_in, const c10::BFloat16* in, c10::BFloat16* out) {
  Bf16PairPanel::pack_row_pairs([&](int64_t i) { return in + i * ld_in; }, k, kBrgemmBlock, out, 2 * kPanelWidth,
                                2 * kBrgemmBlock);
}
#endif

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu
