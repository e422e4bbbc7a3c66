// The decode row kernels: one (sequence, KV heads) work item over a range of keys. Each K and V row of the
// cache is read once per key tile for all query rows of the group (the heads of a GQA group, MLA's heads).
// decode_rows (few rows, memory-bound) keeps the tile in the cache's dtype,
// converted to the accumulation type in registers (bfloat16 / float16 widened by at::vec loads, no
// converted copy of the tile), and multiplied into register-blocked accumulators:
//   scores[rows, keys]  : blocks of kRowBlock rows x kKeyBlock keys, summed over the head dim
//   out[rows, dim_v]    : blocks of kRowBlock rows x kValueBlock vectors, summed over the tile's keys
// with the online softmax (row_ops.h) in between. decode_rows_gemm (many rows, compute-bound: MLA) is in
// decode_gemm_kernel.h.
//
// Included by decode_isa_*.cpp, each of which sets CPU_CAPABILITY (what at::vec compiles to) and
// ATTN_OPS_DECODE_NS (the namespace of its copy) first.
#pragma once

#include "attention/cpu/blas.h"
#include "attention/cpu/decode_cpu.h"
#include "attention/cpu/row_ops.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {
namespace {

// Registers: kRowBlock * (kKeyBlock or kValueBlock) accumulators + the loaded vectors: 8 x 3 + 4 of
// AVX-512's 32, 4 x 2 + 3 of AVX2's 16. Many rows per block (MLA's 16 heads) cut the reloads of each
// key and value vector, which come from L2 once the tile is bigger than L1.
constexpr bool kWide = Vec<float>::size() >= 16;
constexpr int kRowBlock = kWide ? 8 : 4;
constexpr int kKeyBlock = kWide ? 3 : 2;
constexpr int kValueBlock = kWide ? 3 : 2;

// W consecutive values as a vector of the accumulation type (bfloat16 / float16 widened in registers).
inline Vec<float> load_acc(const float* x) { return Vec<float>::loadu(x); }
inline Vec<double> load_acc(const double* x) { return Vec<double>::loadu(x); }
inline Vec<float> load_acc(const c10::BFloat16* x) {
  Vec<float> out;
  at::vec::load_to_float(x, out);
  return out;
}
inline Vec<float> load_acc(const c10::Half* x) {
  Vec<float> out;
  at::vec::load_to_float(x, out);
  return out;
}

// Fully unrolls a loop over a block dimension early, so the accumulator arrays become registers
// (at::vec's vector types may alias any float: an array left in memory is stored on every step).
#if defined(__GNUC__) && !defined(__clang__)
#define ATTN_OPS_UNROLL _Pragma("GCC unroll 16")
#else
#define ATTN_OPS_UNROLL
#endif

// Calls f(std::integral_constant<int, n>) for a runtime n in [1, Max].
template <int Max, typename F>
inline void with_block(int64_t n, const F& f) {
  if constexpr (Max > 1) {
    if (n < Max) {
      return with_block<Max - 1>(n, f);
    }
  }
  f(std::integral_constant<int, Max>{});
}

// The sum of a vector's lanes. Takes a copy: a reference into the caller's accumulator array would make
// the compiler keep that array in memory, storing every accumulator on each step of the loop.
template <typename T>
inline T sum_lanes(Vec<T> v) {
  return at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return a + b; }, v);
}

// s[r * lds + j] = sum_d q[r * dim + d] * key_j[d] for RB rows and KB keys.
template <int RB, int KB, typename scalar_t, typename acc_t>
inline void score_block(const acc_t* q, int64_t dim, const scalar_t* const* keys, acc_t* s, int64_t lds) {
  constexpr int64_t W = Vec<acc_t>::size();
  Vec<acc_t> acc[RB][KB];
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      acc[r][j] = Vec<acc_t>(acc_t(0));
    }
  }
  int64_t d = 0;
  for (; d + W <= dim; d += W) {
    Vec<acc_t> kv[KB];
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      kv[j] = load_acc(keys[j] + d);
    }
    ATTN_OPS_UNROLL
    for (int r = 0; r < RB; ++r) {
      const Vec<acc_t> qv = Vec<acc_t>::loadu(q + r * dim + d);
      ATTN_OPS_UNROLL
      for (int j = 0; j < KB; ++j) {
        acc[r][j] = at::vec::fmadd(qv, kv[j], acc[r][j]);
      }
    }
  }
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      acc_t sum = sum_lanes(acc[r][j]);
      for (int64_t t = d; t < dim; ++t) {
        sum += q[r * dim + t] * static_cast<acc_t>(keys[j][t]);
      }
      s[r * lds + j] = sum;
    }
  }
}

// o[r * ldo + d0 + i] += sum_j p[r * ldp + j] * value_j[d0 + i] for RB rows, i < NB vectors, j < n.
template <int RB, int NB, typename scalar_t, typename acc_t>
inline void value_block(const acc_t* p, int64_t ldp, const scalar_t* const* values, int64_t n, int64_t d0, acc_t* o,
                        int64_t ldo) {
  constexpr int64_t W = Vec<acc_t>::size();
  Vec<acc_t> acc[RB][NB];
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {
    ATTN_OPS_UNROLL
    for (int i = 0; i < NB; ++i) {
      acc[r][i] = Vec<acc_t>::loadu(o + r * ldo + d0 + i * W);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    Vec<acc_t> vv[NB];
    ATTN_OPS_UNROLL
    for (int i = 0; i < NB; ++i) {
      vv[i] = load_acc(values[j] + d0 + i * W);
    }
    ATTN_OPS_UNROLL
    for (int r = 0; r < RB; ++r) {
      const Vec<acc_t> pr(p[r * ldp + j]);
      ATTN_OPS_UNROLL
      for (int i = 0; i < NB; ++i) {
        acc[r][i] = at::vec::fmadd(pr, vv[i], acc[r][i]);
      }
    }
  }
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {
    ATTN_OPS_UNROLL
    for (int i = 0; i < NB; ++i) {
      acc[r][i].store(o + r * ldo + d0 + i * W);
    }
  }
}

// Asks for the cache lines of one row of n values (a hint: no fault, no effect on the result). With the
// cache's rows heads * dim apart (BSHD), one head's rows are kilobytes apart, a stride the hardware
// prefetchers do not follow across pages; the kernel requests each row one key tile ahead. kLocality: 3 into
// L1, 1 into L2 (decode_rows_gemm's tiles are bigger than L1).
template <int kLocality = 3, typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t n) {
#if defined(__GNUC__)
  constexpr int64_t kLine = 64;
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(scalar_t)); off += kLine) {
    __builtin_prefetch(bytes + off, 0, kLocality);
  }
#endif
}

// The loop both row kernels share: key tiles outside, heads inside (a BSHD cache is then read in address
// order, every page once), the online softmax between the two products. tile(head, k0, n) sets a.scores
// [rows, n] = Q K^T of the tile; then, after the softmax turned them into weights, out(head, n) adds P V.
template <typename scalar_t, typename acc_t, typename Scores, typename Values>
void decode_tiles(const DecodeRows<scalar_t, acc_t>& a, const Scores& scores, const Values& values) {
  const int64_t rows = a.rows, Dv = a.dim_v, all_rows = a.heads * rows;
  fill_row(a.row_max, all_rows, -std::numeric_limits<acc_t>::infinity());
  fill_row(a.row_sum, all_rows, acc_t(0));
  fill_row(a.out, all_rows * Dv, acc_t(0));
  for (int64_t k0 = a.k_begin; k0 < a.k_end; k0 += a.tile) {
    for (int64_t head = 0; head < a.heads; ++head) {
      const int64_t n = std::min(a.tile, a.k_end - k0);
      scores(head, k0, n);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t lo = std::max<int64_t>(a.key_lo[r] - k0, 0);
        const int64_t hi = std::min<int64_t>(a.key_hi[r] - k0, n - 1);
        online_softmax_step(a.scores + r * a.tile, n, lo, hi, a.softcap, a.row_max[head * rows + r],
                            a.row_sum[head * rows + r], a.out + (head * rows + r) * Dv, Dv);
      }
      values(head, n);
    }
  }
  for (int64_t r = 0; r < all_rows; ++r) {
    a.lse[r] = finish_row(a.out + r * Dv, Dv, a.row_max[r], a.row_sum[r]);
  }
}

}  // namespace

template <typename scalar_t, typename acc_t>
void decode_rows(const DecodeRows<scalar_t, acc_t>& a) {
  constexpr int64_t W = Vec<acc_t>::size();
  const int64_t rows = a.rows, Dqk = a.dim_qk, Dv = a.dim_v;
  const auto scores = [&](int64_t head, int64_t k0, int64_t n) {
    const acc_t* q = a.q + head * rows * Dqk;
    const int64_t n_next = std::min(a.tile, a.k_end - k0 - n);
    a.locate(a, a.kv_head + head, k0, n + n_next, a.key_rows, a.value_rows);
    // The next tile's rows, requested while this one computes.
    for (int64_t j = n; j < n + n_next; ++j) {
      prefetch_row(a.key_rows[j], Dqk);
      prefetch_row(a.value_rows[j], Dv);
    }
    // scores[rows, n] = Q K^T (q carries the scale)
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
      with_block<kRowBlock>(rows - r0, [&](auto rb) {
        for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
          with_block<kKeyBlock>(n - j0, [&](auto kb) {
            score_block<decltype(rb)::value, decltype(kb)::value>(
                q + r0 * Dqk, Dqk, a.key_rows + j0, a.scores + r0 * a.tile + j0, a.tile);
          });
        }
      });
    }
  };
  const auto values = [&](int64_t head, int64_t n) {
    acc_t* out = a.out + head * rows * Dv;
    // out[rows, Dv] += P V: whole blocks of vectors, then the remaining columns one by one
    const int64_t d_vec = Dv / W * W;
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
      with_block<kRowBlock>(rows - r0, [&](auto rb) {
        for (int64_t d0 = 0; d0 < d_vec; d0 += kValueBlock * W) {
          with_block<kValueBlock>((d_vec - d0) / W, [&](auto nb) {
            value_block<decltype(rb)::value, decltype(nb)::value>(a.scores + r0 * a.tile, a.tile,
                                                                  a.value_rows, n, d0, out + r0 * Dv, Dv);
          });
        }
      });
    }
    for (int64_t d = d_vec; d < Dv; ++d) {
      for (int64_t r = 0; r < rows; ++r) {
        acc_t sum = out[r * Dv + d];
        for (int64_t j = 0; j < n; ++j) {
          sum += a.scores[r * a.tile + j] * static_cast<acc_t>(a.value_rows[j][d]);
        }
        out[r * Dv + d] = sum;
      }
    }
  };
  decode_tiles(a, scores, values);
}

#define ATTN_OPS_INSTANTIATE_DECODE_ROWS(scalar_t)                                                             \
  template void decode_rows<scalar_t, acc_type<scalar_t>>(const DecodeRows<scalar_t, acc_type<scalar_t>>&);
ATTN_OPS_INSTANTIATE_DECODE_ROWS(float)
ATTN_OPS_INSTANTIATE_DECODE_ROWS(double)
ATTN_OPS_INSTANTIATE_DECODE_ROWS(c10::Half)
ATTN_OPS_INSTANTIATE_DECODE_ROWS(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE_DECODE_ROWS

}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS
