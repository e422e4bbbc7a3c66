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

#include "common/cpu/blas.h"
#include "attention/cpu/decode_cpu.h"
#include "attention/cpu/row_ops.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
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

// Keys per score block for RB rows: RB x keys = 16 accumulators where AVX-512 sums them with one
// transposing tree (sum_lanes_16), else kKeyBlock.
template <int RB>
constexpr int score_keys() {
  return kWide && 16 % RB == 0 ? 16 / RB : kKeyBlock;
}

// Whether a bfloat16 kernel may multiply q as the caller gave it (a.q / scale) and apply the scale to the sums:
// rounding the scaled q to bfloat16 instead costs up to 2^-9 of every logit. Not for scales below 2^-10, where
// the unscaled q . k could overflow float32 for inputs whose scaled logits fit (the scaled-q paths keep them).
inline bool multiply_unscaled_q(float scale) {
  return std::isfinite(scale) && std::abs(scale) >= 0x1p-10f;
}

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

#if defined(CPU_CAPABILITY_AVX512)
// The lane sums of 16 vectors in one vector: lane 4 * (i % 4) + i / 4 holds the sum of v[i]. Four levels of
// shuffle-and-add, each halving the vectors (15 steps), instead of a 4-step reduction per vector (64): with a
// head dim of 128 the separate reductions cost as much as the dot products themselves.
inline __m512 sum_lanes_16(const Vec<float> (&v)[16]) {
  __m512 halves[8], quarters[4], pairs[2];
  ATTN_OPS_UNROLL
  for (int i = 0; i < 8; ++i) {  // 256-bit halves: v[2i], v[2i + 1]
    const __m512 a = v[2 * i], b = v[2 * i + 1];
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  ATTN_OPS_UNROLL
  for (int i = 0; i < 4; ++i) {  // 128-bit quarter m: v[4i + m]
    const __m512 a = halves[2 * i], b = halves[2 * i + 1];
    quarters[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  }
  ATTN_OPS_UNROLL
  for (int i = 0; i < 2; ++i) {  // in quarter m, lanes 0-1: v[8i + m], lanes 2-3: v[8i + 4 + m]
    const __m512 a = quarters[2 * i], b = quarters[2 * i + 1];
    pairs[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  }
  // in quarter m: v[m], v[4 + m], v[8 + m], v[12 + m]
  return _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88), _mm512_shuffle_ps(pairs[0], pairs[1], 0xDD));
}

// s[r * lds + j] = the lane sum of acc[r][j], times scale, for RB x KB <= 16 accumulators (sum_lanes_16); V:
// Vec<float> or __m512.
template <int RB, int KB, typename V>
inline void store_lane_sums(const V (&acc)[RB][KB], float* s, int64_t lds, float scale = 1.f) {
  static_assert(RB * KB <= 16);
  Vec<float> flat[16];  // the sum of (r, j) lands in lane r * KB + j; the lanes past RB * KB sum zeros
  ATTN_OPS_UNROLL
  for (int lane = RB * KB; lane < 16; ++lane) {
    flat[4 * (lane % 4) + lane / 4] = Vec<float>(0.f);
  }
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      const int lane = r * KB + j;
      flat[4 * (lane % 4) + lane / 4] = Vec<float>(acc[r][j]);
    }
  }
  const __m512 sums = _mm512_mul_ps(sum_lanes_16(flat), _mm512_set1_ps(scale));
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {  // lanes r * KB .. r * KB + KB - 1 to s + r * lds (masked lanes are not touched)
    const __mmask16 row = static_cast<__mmask16>(((1u << KB) - 1) << (r * KB));
    _mm512_mask_storeu_ps(s + r * (lds - KB), row, sums);
  }
}

#endif

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
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<acc_t, float> && RB * KB == 16) {
    if (d == dim) {
      return store_lane_sums<RB, KB>(acc, s, lds);
    }
  }
#endif
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

// The columns value_block's whole vectors leave: o[r * ldo + d] += sum_j p[r * ldp + j] * value_j[d] for
// d in [d_begin, dim_v), r < rows, j < n, one value at a time.
template <typename scalar_t, typename acc_t>
inline void value_columns_tail(const acc_t* p, int64_t ldp, int64_t rows, const scalar_t* const* values, int64_t n,
                               int64_t d_begin, int64_t dim_v, acc_t* o, int64_t ldo) {
  for (int64_t d = d_begin; d < dim_v; ++d) {
    for (int64_t r = 0; r < rows; ++r) {
      acc_t sum = o[r * ldo + d];
      for (int64_t j = 0; j < n; ++j) {
        sum += p[r * ldp + j] * static_cast<acc_t>(values[j][d]);
      }
      o[r * ldo + d] = sum;
    }
  }
}

// Asks for the cache lines of one row of n values, into L2 (a hint: no fault, no effect on the result). Rows
// that are not one run in memory (paged blocks, a head's rows heads * dim apart) break the hardware prefetchers'
// streams at every jump; the kernels request them ahead (stream_tiles, decode_rows_gemm). Into L2, not L1: a
// phase's rows (a tile of K or V) fill L1 and evicted the q rows and accumulators the kernel keeps there
// (zen4_decode_overlap.md: float32 decode 1.1-1.4x faster than with prefetcht0; 16-bit caches and
// decode_rows_gemm's tiles, bigger than L1, always took L2).
template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t n) {
#if defined(__GNUC__)
  constexpr int64_t kLine = 64;
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(scalar_t)); off += kLine) {
#if defined(__x86_64__)
    // volatile asm: GCC -O3 may delete a loop of __builtin_prefetch as having no effect (-ffinite-loops)
    asm volatile("prefetcht1 %0" : : "m"(bytes[off]));
#else
    __builtin_prefetch(bytes + off, 0, 1);
#endif
  }
#endif
}

// Reads one byte of each cache line of a row of n values with plain loads, so the row is in the cache when the
// kernel reaches it (stream_tiles' staged reads). The loads do not depend on each other: the core keeps many
// misses in flight and the hardware prefetchers follow the run, where software prefetches of the same lines,
// spread over the arithmetic, left most of the latency exposed on Zen 4.
template <typename scalar_t>
inline void touch_row(const scalar_t* row, int64_t n) {
  constexpr int64_t kLine = 64;
  const volatile char* bytes = reinterpret_cast<const volatile char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(scalar_t)); off += kLine) {
    (void)bytes[off];  // volatile: the compiler keeps the load
  }
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
        online_softmax_step(a.scores + r * a.tile, n, lo, hi, a.softcap, a.alibi_row(head, r, k0),
                            a.row_max[head * rows + r], a.row_sum[head * rows + r], a.out + (head * rows + r) * Dv,
                            Dv);
      }
      values(head, n);
    }
  }
  for (int64_t r = 0; r < all_rows; ++r) {
    a.lse[r] = finish_row(a.out + r * Dv, Dv, a.row_max[r], a.row_sum[r]);
  }
}

// decode_rows' blocks on at::vec (every dtype and instruction set): score_block and value_block on the
// accumulation type, the output accumulated in a.out in the natural order.
template <typename scalar_t, typename acc_t>
struct VecBlocks {
  static constexpr int kRowBlock = ::attn_ops::cpu::ATTN_OPS_DECODE_NS::kRowBlock;
  const DecodeRows<scalar_t, acc_t>& a;

  template <int RB>
  static constexpr int score_keys() {
    return ::attn_ops::cpu::ATTN_OPS_DECODE_NS::score_keys<RB>();
  }

  // s[r * lds + j] = q[head, r0 + r] . keys[j] for RB rows, KB keys.
  template <int RB, int KB>
  void scores(int64_t head, int64_t r0, const scalar_t* const* keys, acc_t* s, int64_t lds) const {
    score_block<RB, KB>(a.q + (head * a.rows + r0) * a.dim_qk, a.dim_qk, keys, s, lds);
  }

  // out[head, r0 + r] += sum_j p[r * ldp + j] * vrows[j] for RB rows, j < n.
  template <int RB>
  void values(int64_t head, int64_t r0, const acc_t* p, int64_t ldp, const scalar_t* const* vrows, int64_t n) const {
    constexpr int64_t W = Vec<acc_t>::size();
    const int64_t Dv = a.dim_v, d_vec = Dv / W * W;
    acc_t* out = a.out + (head * a.rows + r0) * Dv;
    for (int64_t d0 = 0; d0 < d_vec; d0 += kValueBlock * W) {
      with_block<kValueBlock>((d_vec - d0) / W, [&](auto nb) {
        value_block<RB, decltype(nb)::value>(p, ldp, vrows, n, d0, out, Dv);
      });
    }
    value_columns_tail(p, ldp, RB, vrows, n, d_vec, Dv, out, Dv);
  }
};

// Key tiles outside; inside each, the scores walk the tile's cache rows in address order (key by key, every
// KV head of a key before the next key: with BSHD one contiguous run of heads * dim values per key), which
// the hardware prefetchers follow within each page; a head-by-head walk touches a different page every
// row. scores[heads, rows, n] = Q K^T for every head (blocks.scores), then the online softmax of every row,
// then acc += P V head by head (blocks.values; acc [heads, rows, ld_acc], the blocks' output accumulators).
// Ends with acc normalized and a.lse set.
//
// How the cache rows reach the core depends on the item:
// - one KV head (its rows contiguous: a [B, Hkv, T, D] cache, head-major paged blocks): while one phase
//   computes, the next one's rows are requested by software prefetch in address order (the values during the
//   scores, the next tile's keys during the values);
// - several KV heads (BSHD: each key's heads one run): staged reads. Each phase first reads its rows with
//   plain loads (touch_row), then computes on them from L2, and each tile starts by requesting the first line
//   of every run of the next tile, which gets its page walks and the hardware prefetchers going. On Zen 4 this
//   read the BSHD cache 1.2-1.5x faster (float32) and 1.1-1.3x (bfloat16) than the prefetches spread over the
//   arithmetic, whose misses stayed exposed; over one-head items it was 1.1-1.6x slower
//   (zen4_decode_staged.md).
template <typename scalar_t, typename acc_t, typename Blocks>
void stream_tiles(const DecodeRows<scalar_t, acc_t>& a, const Blocks& blocks, acc_t* acc, int64_t ld_acc) {
  constexpr int kRows = Blocks::kRowBlock;
  const int64_t heads = a.heads, rows = a.rows, Dqk = a.dim_qk, Dv = a.dim_v, tile = a.tile;
  const int64_t all_rows = heads * rows, per_tile = heads * tile;
  fill_row(a.row_max, all_rows, -std::numeric_limits<acc_t>::infinity());
  fill_row(a.row_sum, all_rows, acc_t(0));
  fill_row(acc, all_rows * ld_acc, acc_t(0));
  // The rows of tile k0 into buffer buf (0 or 1): key_rows[buf * per_tile + head * tile + j].
  const auto locate_tile = [&](int64_t k0, int64_t buf) {
    const int64_t n = std::min(tile, a.k_end - k0);
    for (int64_t head = 0; head < heads; ++head) {
      a.locate(a, a.kv_head + head, k0, n, a.key_rows + buf * per_tile + head * tile,
               a.value_rows + buf * per_tile + head * tile);
    }
  };
  // Calls f(run, values) for row j (of every head) of a tile's rows `of`: one run of heads * dim values where the
  // heads' rows of a key are contiguous (BSHD, paged blocks), else each head's row.
  const auto for_each_run = [&](const scalar_t* const* of, int64_t j, int64_t dim, const auto& f) {
    if (of[(heads - 1) * tile + j] == of[j] + (heads - 1) * dim) {
      return f(of[j], heads * dim);
    }
    for (int64_t head = 0; head < heads; ++head) {
      f(of[head * tile + j], dim);
    }
  };
  // Rows of an 8-bit cache that the blocks convert in registers (DecodeRows::rows_8bit) hold dim bytes: half as
  // many scalar_t as their dim.
  const bool byte_rows = a.rows_8bit != Cache8Bit::none && a.converted_keys == nullptr;
  const auto prefetch_rows = [&](const scalar_t* const* of, int64_t j, int64_t dim) {
    for_each_run(of, j, dim, [&](const scalar_t* run, int64_t n) {
      constexpr int64_t size = sizeof(scalar_t);
      prefetch_row(run, byte_rows ? (n + size - 1) / size : n);
    });
  };
  const auto touch_rows = [&](const scalar_t* const* of, int64_t n, int64_t dim) {
    for (int64_t j = 0; j < n; ++j) {
      for_each_run(of, j, dim, [](const scalar_t* run, int64_t m) { touch_row(run, m); });
    }
  };
  const bool staged = staged_tile_reads(heads);  // else heads == 1
  if (a.k_begin < a.k_end) {
    locate_tile(a.k_begin, 0);
  }
  int64_t buf = 0;
  for (int64_t k0 = a.k_begin; k0 < a.k_end; k0 += tile, buf ^= 1) {
    const int64_t n = std::min(tile, a.k_end - k0), n_next = std::min(tile, a.k_end - k0 - n);
    const scalar_t* const* keys = a.key_rows + buf * per_tile;
    const scalar_t* const* values = a.value_rows + buf * per_tile;
    const scalar_t* const* next_keys = a.key_rows + (buf ^ 1) * per_tile;
    const scalar_t* const* next_values = a.value_rows + (buf ^ 1) * per_tile;
    if (n_next > 0) {
      locate_tile(k0 + n, buf ^ 1);
    }
    if (staged) {
      for (int64_t j = 0; j < n_next; ++j) {
        for_each_run(next_keys, j, Dqk, [](const scalar_t* run, int64_t) { prefetch_row(run, 1); });
        for_each_run(next_values, j, Dv, [](const scalar_t* run, int64_t) { prefetch_row(run, 1); });
      }
      touch_rows(keys, n, Dqk);
    }
    // scores[head, r, j] = q[head, r] . key_j (times the softmax scale)
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      with_block<kRows>(rows - r0, [&](auto rb) {
        constexpr int RB = decltype(rb)::value, KB = Blocks::template score_keys<RB>();
        for (int64_t j0 = 0; j0 < n; j0 += KB) {
          if (r0 == 0 && !staged) {
            for (int64_t j = j0; j < std::min(j0 + KB, n); ++j) {
              prefetch_rows(values, j, Dv);
            }
          }
          for (int64_t head = 0; head < heads; ++head) {
            with_block<KB>(n - j0, [&](auto kb) {
              blocks.template scores<RB, decltype(kb)::value>(head, r0, keys + head * tile + j0,
                                                              a.scores + (head * rows + r0) * tile + j0, tile);
            });
          }
        }
      });
    }
    for (int64_t hr = 0; hr < all_rows; ++hr) {
      const int64_t r = hr % rows;
      const int64_t lo = std::max<int64_t>(a.key_lo[r] - k0, 0), hi = std::min<int64_t>(a.key_hi[r] - k0, n - 1);
      online_softmax_step(a.scores + hr * tile, n, lo, hi, a.softcap, a.alibi_row(hr / rows, r, k0), a.row_max[hr],
                          a.row_sum[hr], acc + hr * ld_acc, ld_acc);
    }
    if (staged) {
      touch_rows(values, n, Dv);
    } else {  // one head: the next tile's keys are requested, in address order, while its values are multiplied
      for (int64_t j = 0; j < n_next; ++j) {
        prefetch_rows(next_keys, j, Dqk);
      }
    }
    // acc[head, r] += sum_j scores[head, r, j] * value_j, a head's whole tile at once (its accumulators are
    // loaded and stored once per tile: per 8 keys they cost 4-13% more)
    for (int64_t head = 0; head < heads; ++head) {
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        with_block<kRows>(rows - r0, [&](auto rb) {
          blocks.template values<decltype(rb)::value>(head, r0, a.scores + (head * rows + r0) * tile, tile,
                                                      values + head * tile, n);
        });
      }
    }
  }
  for (int64_t r = 0; r < all_rows; ++r) {
    a.lse[r] = finish_row(acc + r * ld_acc, ld_acc, a.row_max[r], a.row_sum[r]);
  }
}

}  // namespace
}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS

#include "attention/cpu/decode_bf16_kernel.h"

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {

// The streaming row kernel: stream_tiles with the bfloat16 blocks where they exist (AVX-512), else at::vec's.
template <typename scalar_t, typename acc_t>
void decode_rows(const DecodeRows<scalar_t, acc_t>& a) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    return decode_rows_bf16(a);
  }
#endif
  stream_tiles(a, VecBlocks<scalar_t, acc_t>{a}, a.out, a.dim_v);
}

#define ATTN_OPS_INSTANTIATE_DECODE_ROWS(scalar_t)                                                             \
  template void decode_rows<scalar_t, acc_type<scalar_t>>(const DecodeRows<scalar_t, acc_type<scalar_t>>&);
ATTN_OPS_INSTANTIATE_DECODE_ROWS(float)
ATTN_OPS_INSTANTIATE_DECODE_ROWS(double)
ATTN_OPS_INSTANTIATE_DECODE_ROWS(c10::Half)
ATTN_OPS_INSTANTIATE_DECODE_ROWS(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE_DECODE_ROWS

}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS
