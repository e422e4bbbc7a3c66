// decode_rows_gemm: the decode row kernel for many query rows per KV head (MLA's heads, large GQA groups),
// where each key feeds enough FLOPs that decode is compute-bound. Four ways to multiply a key tile:
//  - AVX-512, float32 accumulation: register-blocked FMA micro-kernels that read the tile where it lies, no
//    packing (fma_scores_block / fma_values), on float32 rows or on a float32 copy of a low-precision tile;
//  - AVX-512 with AMX-BF16, bfloat16 (decode_amx_kernel.h): both products on the tile registers in bfloat16;
//  - AVX-512 with AVX512-BF16 (no AMX), bfloat16 (decode_rows_pairs): the same scores kernel on bfloat16
//    pairs, key rows read in place, and P V on the prefill's panel micro-kernel (gemm_kernels.h);
//  - elsewhere (AVX2, portable, float64): two GEMMs per tile on the vendor BLAS.
//
// Included by decode_isa_*.cpp after decode_kernel.h (whose decode_tiles loop, blocking helpers and
// value_block it shares), in the same namespace.
#pragma once

#include "attention/cpu/decode_amx_kernel.h"
#include "attention/cpu/decode_kernel.h"
#include "attention/cpu/gemm_kernels.h"

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {
namespace {

// The n rows at rows[j] (dim values each) as row-major acc_t matrices for the BLAS: calls f(j0, len, matrix,
// ld) for rows j0 .. j0 + len - 1. float32 / float64 rows are passed in place, one matrix per run of equally
// spaced rows (a paged cache's block ends split a tile); other dtypes are converted into `buffer` [n, dim]
// and passed as one matrix.
template <typename scalar_t, typename acc_t, typename F>
void for_each_run(const scalar_t* const* rows, int64_t n, int64_t dim, acc_t* buffer, const F& f) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    for (int64_t j0 = 0, len = 0; j0 < n; j0 += len) {
      const int64_t stride = j0 + 1 < n ? rows[j0 + 1] - rows[j0] : dim;
      for (len = 1; j0 + len < n && rows[j0 + len] - rows[j0 + len - 1] == stride; ++len) {
      }
      int64_t ld = 0;
      const acc_t* m = load_key_tile(rows[j0], stride, len, dim, buffer + j0 * dim, &ld);
      f(j0, len, m, ld);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      convert_row(rows[j], buffer + j * dim, dim);
    }
    f(int64_t(0), n, static_cast<const acc_t*>(buffer), dim);
  }
}

// Each key tile as two GEMMs on the vendor BLAS (which picks its own instruction set at run time) over the
// tile in place where it can (see for_each_run).
template <typename scalar_t, typename acc_t>
void decode_rows_blas(const DecodeRows<scalar_t, acc_t>& a) {
  const int64_t rows = a.rows, Dqk = a.dim_qk, Dv = a.dim_v;
  const auto scores = [&](int64_t head, int64_t k0, int64_t n) {
    a.locate(a, a.kv_head + head, k0, n, a.key_rows, a.value_rows);
    const acc_t* q = a.q + head * rows * Dqk;
    for_each_run(a.key_rows, n, Dqk, a.key_tile, [&](int64_t j0, int64_t len, const acc_t* keys, int64_t ld) {
      gemm<acc_t>(false, true, rows, len, Dqk, 1, q, Dqk, keys, ld, 0, a.scores + j0, a.tile);
    });
  };
  const auto values = [&](int64_t head, int64_t n) {
    acc_t* out = a.out + head * rows * Dv;
    const auto add_pv = [&](int64_t j0, int64_t len, const acc_t* vals, int64_t ld) {
      gemm<acc_t>(false, false, rows, Dv, len, 1, a.scores + j0, a.tile, vals, ld, 1, out, Dv);
    };
    // MLA: the values are the first dim_v features of the key rows, already converted with the keys.
    if (!std::is_same_v<scalar_t, acc_t> && values_in_keys(a, n)) {
      add_pv(0, n, a.key_tile, Dqk);
    } else {
      for_each_run(a.value_rows, n, Dv, a.value_tile, add_pv);
    }
  };
  decode_tiles(a, scores, values);
}

// Register blocks of the FMA micro-kernels (AVX-512: 32 vector registers of 16 floats).
constexpr int kHeadVecs = 2;     // scores: up to 32 query rows (lanes of 2 vectors) ...
constexpr int kScoreKeys = 12;   // ... times 12 keys: 24 accumulators + 2 Q vectors + a broadcast key value
constexpr int kPvRows = 4;       // P V: 4 rows ...
constexpr int kPvVecs = 6;       // ... times 6 vectors of 16 values: 24 accumulators, 6 value vectors

// scores[r * lds + j] = sum_d keys[j][d] * Q[r][d] for KB keys and the rows r < rows of HB vectors, per
// Panel (gemm_kernels.h) step of S = Panel::kStep dims: each key's S values are broadcast into one
// multiply-add per vector of rows (FloatPanel: an FMA; Bf16PairPanel: vdpbf16ps on a pair), so the keys are
// read once, in place, and Q stays in L1 (qt: Q^T in steps, [dim / S, hp, S], hp = gemm_rows_padded(rows)
// >= whole vectors, zero past rows).
// The registers sum kScoreChunk dims at a time and each chunk's sums are added into `total` (L1): one chain
// of 576 FMAs per score (MLA's key rows) had 2-4x the rounding error of the BLAS's dot products, whose sums
// are blocked the same way; the extra adds are one per kScoreChunk dims.
constexpr int64_t kScoreChunk = 64;
template <typename Panel, int KB, int HB>
inline void fma_scores_block(const typename Panel::b_t* qt, int64_t hp, int64_t dim,
                             const typename Panel::a_t* const* keys, int64_t rows, float* s, int64_t lds) {
  constexpr int64_t W = Vec<float>::size(), S = Panel::kStep;
  Vec<float> total[KB][HB];
  ATTN_OPS_UNROLL
  for (int j = 0; j < KB; ++j) {
    ATTN_OPS_UNROLL
    for (int i = 0; i < HB; ++i) {
      total[j][i] = Vec<float>(0.f);
    }
  }
  for (int64_t d0 = 0; d0 < dim; d0 += kScoreChunk) {
    Vec<float> acc[KB][HB];
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      ATTN_OPS_UNROLL
      for (int i = 0; i < HB; ++i) {
        acc[j][i] = Vec<float>(0.f);
      }
    }
    const int64_t d_end = std::min(dim, d0 + kScoreChunk);
    for (int64_t d = d0; d < d_end; d += S) {
      Vec<float> qv[HB];
      ATTN_OPS_UNROLL
      for (int i = 0; i < HB; ++i) {
        qv[i] = Panel::load(qt + (d / S * hp + i * W) * S);
      }
      ATTN_OPS_UNROLL
      for (int j = 0; j < KB; ++j) {
        ATTN_OPS_UNROLL
        for (int i = 0; i < HB; ++i) {
          acc[j][i] = Panel::multiply_add(keys[j] + d, qv[i], acc[j][i]);
        }
      }
    }
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      ATTN_OPS_UNROLL
      for (int i = 0; i < HB; ++i) {
        total[j][i] = total[j][i] + acc[j][i];
      }
    }
  }
  // Transposed store: a key's vector holds that key's score for W rows.
  alignas(64) float lanes[W];
  ATTN_OPS_UNROLL
  for (int j = 0; j < KB; ++j) {
    ATTN_OPS_UNROLL
    for (int i = 0; i < HB; ++i) {
      total[j][i].store(lanes);
      for (int64_t l = 0; l < W && i * W + l < rows; ++l) {
        s[(i * W + l) * lds + j] = lanes[l];
      }
    }
  }
}

// scores[rows, n] (row stride lds) = Q K^T over the n key rows at keys[j] (anywhere in memory; qt as
// fma_scores_block's); prefetch(j0, len) is called before each block of keys j0 .. j0 + len - 1 (the
// caller's next tile).
template <typename Panel, typename Prefetch>
inline void fma_scores(const typename Panel::b_t* qt, int64_t rows, int64_t dim,
                       const typename Panel::a_t* const* keys, int64_t n, float* s, int64_t lds,
                       const Prefetch& prefetch) {
  constexpr int64_t W = Vec<float>::size();
  const int64_t vecs = (rows + W - 1) / W, hp = gemm_rows_padded(rows);
  for (int64_t v0 = 0; v0 < vecs; v0 += kHeadVecs) {
    with_block<kHeadVecs>(vecs - v0, [&](auto hb) {
      for (int64_t j0 = 0; j0 < n; j0 += kScoreKeys) {
        with_block<kScoreKeys>(n - j0, [&](auto kb) {
          if (v0 == 0) {
            prefetch(j0, decltype(kb)::value);
          }
          fma_scores_block<Panel, decltype(kb)::value, decltype(hb)::value>(
              qt + v0 * W * Panel::kStep, hp, dim, keys + j0, rows - v0 * W, s + v0 * W * lds + j0, lds);
        });
      }
    });
  }
}

// out[rows, dim_v] += P[rows, n] V over the n value rows at values[j]: blocks of kPvRows rows x kPvVecs
// vectors (value_block), column blocks outside so a block's slice of the tile is reused from L1 by every
// row block; the columns past the last whole vector one by one.
template <typename scalar_t>
inline void fma_values(const float* p, int64_t ldp, int64_t rows, const scalar_t* const* values, int64_t n,
                       int64_t dim_v, float* out) {
  constexpr int64_t W = Vec<float>::size();
  const int64_t d_vec = dim_v / W * W;
  for (int64_t d0 = 0; d0 < d_vec; d0 += kPvVecs * W) {
    with_block<kPvVecs>((d_vec - d0) / W, [&](auto nb) {
      for (int64_t r0 = 0; r0 < rows; r0 += kPvRows) {
        with_block<kPvRows>(rows - r0, [&](auto rb) {
          value_block<decltype(rb)::value, decltype(nb)::value>(p + r0 * ldp, ldp, values, n, d0,
                                                                out + r0 * dim_v, dim_v);
        });
      }
    });
  }
  value_columns_tail(p, ldp, rows, values, n, d_vec, dim_v, out, dim_v);
}

// How the rows of a tile of n keys reach fma_scores, the next tile's n_next rows being in a.key_rows / a.value_rows
// after this tile's (a.locate); returns fma_scores' prefetch. Where a tile's rows are adjacent in memory (MLA's
// latent rows, a KV head of a [B, Hkv, T, D] cache, paged blocks), staged reads as in stream_tiles: the first
// line of each of the next tile's rows requested now, this tile's rows read by plain loads before the products
// (Zen 4, builds in turn: MLA B=16 H=16 1.12x bfloat16 / 1.06x float32, H=128 no change; GQA 64/8 over [B, Hkv,
// T, D] 1.23x float32 / 1.03x bfloat16; zen4_decode_gemm_staged.md). Elsewhere (a KV head of a BSHD cache, its
// rows Hkv * D apart, where the staged reads were 1.1-1.16x slower) the next tile's rows are requested into L2
// block by block during the scores.
template <typename scalar_t>
auto tile_reads(const DecodeRows<scalar_t, float>& a, int64_t n, int64_t n_next) {
  const bool values_apart = a.value_rows[0] != a.key_rows[0];
  const bool staged = n > 1 && a.key_rows[1] == a.key_rows[0] + a.dim_qk &&
                      (!values_apart || a.value_rows[1] == a.value_rows[0] + a.dim_v);
  if (staged) {
    for (int64_t j = n; j < n + n_next; ++j) {
      prefetch_row(a.key_rows[j], 1);
      if (values_apart) {
        prefetch_row(a.value_rows[j], 1);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      touch_row(a.key_rows[j], a.dim_qk);
      if (values_apart) {
        touch_row(a.value_rows[j], a.dim_v);
      }
    }
  }
  return [&a, n, n_next, staged](int64_t j0, int64_t len) {
    for (int64_t j = n + j0; !staged && j < std::min(n + j0 + len, n + n_next); ++j) {
      prefetch_row(a.key_rows[j], a.dim_qk);
      if (a.value_rows[j] != a.key_rows[j]) {
        prefetch_row(a.value_rows[j], a.dim_v);
      }
    }
  };
}

// Q^T of every KV head in fma_scores' layout for a panel kind (S = Panel::kStep dims per step): out [heads,
// Dqk / S, hp, S] in Panel::b_t, hp = gemm_rows_padded(rows), zero past rows; q as a.q holds it, or, when
// `unscaled`, as the caller gave it (divided by a.q_factor(head)).
template <typename Panel, typename scalar_t>
void arrange_q_steps(const DecodeRows<scalar_t, float>& a, typename Panel::b_t* out, bool unscaled = false) {
  using T = typename Panel::b_t;
  constexpr int64_t S = Panel::kStep;
  const int64_t rows = a.rows, Dqk = a.dim_qk, hp = gemm_rows_padded(rows);
  for (int64_t head = 0; head < a.heads; ++head) {
    const float factor = unscaled ? 1.f / a.q_factor(head) : 1.f;
    T* qh = out + head * Dqk * hp;
    std::fill(qh, qh + Dqk * hp, T(0));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < Dqk; ++d) {
        qh[(d / S * hp + r) * S + d % S] = static_cast<T>(a.q[(head * rows + r) * Dqk + d] * factor);
      }
    }
  }
}

// The FMA micro-kernel path (float32 accumulation): Q^T of every KV head arranged once per call in a.q_t;
// float32 tiles read in place, bfloat16 / float16 tiles converted once into a.key_tile / a.value_tile
// (the scores kernel broadcasts single key values, which a low-precision row would need widened one by one).
template <typename scalar_t>
void decode_rows_fma(const DecodeRows<scalar_t, float>& a) {
  TORCH_INTERNAL_ASSERT(a.tile <= kGemmDecodeTile);
  const int64_t rows = a.rows, Dqk = a.dim_qk, Dv = a.dim_v, hp = gemm_rows_padded(rows);
  arrange_q_steps<FloatPanel>(a, a.q_t);
  // float32 tiles: the cache rows themselves; others: the rows of the converted tiles.
  const float* converted_keys[kGemmDecodeTile];
  const float* converted_values[kGemmDecodeTile];
  const float* const* key_rows = converted_keys;
  const float* const* value_rows = converted_values;
  if constexpr (std::is_same_v<scalar_t, float>) {
    key_rows = a.key_rows;
    value_rows = a.value_rows;
  }
  const auto scores = [&](int64_t head, int64_t k0, int64_t n) {
    const int64_t n_next = std::min(a.tile, a.k_end - k0 - n);
    a.locate(a, a.kv_head + head, k0, n + n_next, a.key_rows, a.value_rows);
    const auto prefetch = tile_reads(a, n, n_next);
    if constexpr (!std::is_same_v<scalar_t, float>) {
      const bool shared = values_in_keys(a, n);
      for (int64_t j = 0; j < n; ++j) {
        convert_row(a.key_rows[j], a.key_tile + j * Dqk, Dqk);
        converted_keys[j] = a.key_tile + j * Dqk;
        if (!shared) {
          convert_row(a.value_rows[j], a.value_tile + j * Dv, Dv);
        }
        converted_values[j] = shared ? converted_keys[j] : a.value_tile + j * Dv;
      }
    }
    fma_scores<FloatPanel>(a.q_t + head * Dqk * hp, rows, Dqk, key_rows, n, a.scores, a.tile, prefetch);
  };
  const auto values = [&](int64_t head, int64_t n) {
    fma_values(a.scores, a.tile, rows, value_rows, n, Dv, a.out + head * rows * Dv);
  };
  decode_tiles(a, scores, values);
}

#if defined(CPU_CAPABILITY_AVX512)
// Whether decode_rows_pairs takes this call: bfloat16, whole pairs of features and keys, whole panels of
// values, on a CPU with AVX512-BF16.
template <typename scalar_t, typename acc_t>
bool pairs_apply(const DecodeRows<scalar_t, acc_t>& a) {
  return std::is_same_v<scalar_t, c10::BFloat16> && a.dim_qk % 2 == 0 && a.dim_v % kPanelWidth == 0 &&
         a.tile % 2 == 0 && pair_products_available();
}

// bfloat16 caches on AVX512-BF16 (where AMX does not run): both products on bfloat16 pairs with float32
// accumulation (vdpbf16ps: twice an FMA's products per instruction), as the prefill forward's Bf16PairPanel.
// The scores read each key row in place (fma_scores: its pairs broadcast against Q^T in pairs, arranged once
// per call); P V runs on the panel micro-kernel (panel_gemm) over the tile's values interleaved by key pairs
// (an L2 pass over rows the scores just read). q is multiplied as the caller gave it (bfloat16: exact) and the
// scale applied to the sums (multiply_unscaled_q; rounding the scaled q cost up to 2^-9 of each logit). P is
// rounded to bfloat16, as on AMX and in SDPA's CPU kernel; no float32 copy of the tile.
template <typename scalar_t>
void decode_rows_pairs(const DecodeRows<scalar_t, float>& a) {
  using bf16 = c10::BFloat16;
  static_assert(std::is_same_v<scalar_t, bf16>);
  constexpr int64_t W = kPanelWidth;
  const int64_t rows = a.rows, Dqk = a.dim_qk, Dv = a.dim_v, tile = a.tile, hp = gemm_rows_padded(rows);
  TORCH_INTERNAL_ASSERT(tile <= kGemmDecodeTile);
  // Scratch (DecodeScratch's lowp, as the AMX kernel's): Q^T in pairs [heads, Dqk / 2, hp, 2], an unused
  // [tile, Dqk], the V panels [Dv / W, tile / 2, W, 2] and P [rows, tile].
  bf16* q_pairs = a.lowp;
  bf16* v_panels = q_pairs + a.heads * hp * Dqk + tile * Dqk;
  bf16* p = v_panels + tile * Dv;
  const bool unscaled = multiply_unscaled_q(a.scale);
  arrange_q_steps<Bf16PairPanel>(a, q_pairs, unscaled);
  const auto scores = [&](int64_t head, int64_t k0, int64_t n) {
    const int64_t n_next = std::min(tile, a.k_end - k0 - n);
    a.locate(a, a.kv_head + head, k0, n + n_next, a.key_rows, a.value_rows);
    fma_scores<Bf16PairPanel>(q_pairs + head * Dqk * hp, rows, Dqk, a.key_rows, n, a.scores, tile,
                              tile_reads(a, n, n_next));
    if (unscaled) {
      for (int64_t r = 0; r < rows; ++r) {
        scale_row(a.scores + r * tile, n, a.q_factor(head));
      }
    }
  };
  const auto values = [&](int64_t head, int64_t n) {
    const int64_t pairs = (n + 1) / 2;
    for (int64_t r = 0; r < rows; ++r) {  // the softmax's weights in bfloat16, a zero key after an odd last one
      convert_row(a.scores + r * tile, p + r * tile, n);
      std::fill(p + r * tile + n, p + r * tile + 2 * pairs, bf16(0));
    }
    Bf16PairPanel::pack_row_pairs([&](int64_t j) { return a.value_rows[j]; }, n, Dv, v_panels, tile * W, 2 * W);
    panel_gemm<true, Bf16PairPanel>(rows, Dv / W, pairs, p, tile, v_panels, 2 * W, tile * W, a.out + head * rows * Dv,
                                    Dv, 1.f);
  };
  decode_tiles(a, scores, values);
}
#endif

}  // namespace

template <typename scalar_t, typename acc_t>
void decode_rows_gemm(const DecodeRows<scalar_t, acc_t>& a) {
  if constexpr (kWide && std::is_same_v<acc_t, float>) {
#if ATTN_OPS_DECODE_AMX
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      if (a.lowp != nullptr && amx_applies(a)) {
        return decode_rows_amx(a);
      }
    }
#endif
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      if (a.lowp != nullptr && pairs_apply(a)) {
        return decode_rows_pairs(a);
      }
    }
#endif
    decode_rows_fma(a);
  } else {
    decode_rows_blas(a);
  }
}

#define ATTN_OPS_INSTANTIATE_DECODE_ROWS_GEMM(scalar_t) \
  template void decode_rows_gemm<scalar_t, acc_type<scalar_t>>(const DecodeRows<scalar_t, acc_type<scalar_t>>&);
ATTN_OPS_INSTANTIATE_DECODE_ROWS_GEMM(float)
ATTN_OPS_INSTANTIATE_DECODE_ROWS_GEMM(double)
ATTN_OPS_INSTANTIATE_DECODE_ROWS_GEMM(c10::Half)
ATTN_OPS_INSTANTIATE_DECODE_ROWS_GEMM(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE_DECODE_ROWS_GEMM

}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS
