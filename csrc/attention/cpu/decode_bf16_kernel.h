// The AVX-512 blocks of decode_rows (decode_kernel.h) for a bfloat16 cache. bfloat16 is the upper half of a
// float32, so one 512-bit load of 32 values widens into the float32 vectors of its even and odd elements with
// one shift and one mask (even: x << 16, odd: x & 0xffff0000), no shuffles: at::vec's widening
// (vpmovzxwd + shift per 16 values) took the shuffle port that the FMAs share and made bf16 decode
// instruction-bound. The kernel keeps every 32 columns in that order, [16 even | 16 odd]:
//   - Q K^T: float32 FMAs on the widened keys against a copy of q (scaled) rearranged into that order; or, where
//     AVX512-BF16 runs at the FMA's rate (decode_scores_on_pairs), vdpbf16ps on the key chunk as loaded against
//     q's bfloat16 values. On a Sapphire Rapids class machine vdpbf16ps issues one per 2 cycles (0.54 ns against
//     0.14 ns for vfmadd231ps, 24 independent chains each), so its 32 products per instruction cost twice the
//     FMAs' 16, and the whole kernel ran 9% slower with it (L1-resident cache, one thread); on Zen 4 both take
//     0.273 ns.
//   - P V: float32 FMAs of the weights (float32, as the other dtypes) into accumulators whose columns stay in
//     that order; rearranged into the natural order once, at the end (bf16_unpermute_row). Where Q K^T runs on
//     pairs, P V does too (bf16_value_block_pairs): the weights rounded to bfloat16, two keys' values
//     interleaved in registers, half the instructions; on Zen 4 the kernel's arithmetic took 25% less time
//     (decode_compute_probe.py, L1: 25.0 -> 18.7 ns per key and KV head) and decode ran 1.1x faster
//     (zen4_decode_pairs_pv.md).
// Any head dim: the last partial 32 columns are read with a masked load (zeros past the row's end).
//
// Included by decode_kernel.h (whose stream_tiles loop and helpers it uses), in the same namespace; AVX-512
// copies only.
#pragma once

#include "attention/cpu/cache_8bit.h"

#include <cstring>

#if defined(CPU_CAPABILITY_AVX512)

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {
namespace {

// Columns per chunk: one 512-bit vector of bfloat16.
constexpr int64_t kBf16Chunk = 32;

// The first `count` bits set (count <= 32): the elements of a partial chunk.
inline __mmask32 chunk_mask(int64_t count) {
  return count >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((uint32_t(1) << count) - 1);
}

// One chunk of bfloat16 as raw 16-bit lanes; kMasked: only the lanes of `mask` are read, the others are 0.
template <bool kMasked>
inline __m512i load_chunk(const c10::BFloat16* x, __mmask32 mask) {
  if constexpr (kMasked) {
    return _mm512_maskz_loadu_epi16(mask, x);
  } else {
    return _mm512_loadu_si512(x);
  }
}

// How the blocks read a chunk of a row, as raw bfloat16 lanes: a bfloat16 cache's rows as they are...
struct Bf16Rows {
  template <bool kMasked>
  __m512i chunk(const c10::BFloat16* row, int64_t d, __mmask32 mask) const {
    return load_chunk<kMasked>(row + d, mask);
  }
};

// ... or the rows of an 8-bit cache (row: its byte address, as locate gives it when it converts nothing), each
// chunk of 32 codes converted in registers through the bfloat16 byte tables (cache_8bit.h's ByteTableRegs, then
// put in the natural order), with no tile converted through L1 first (cache_8bit.h's dequantize_row, which was
// slower than the bfloat16 cache: zen4_cache_8bit.md); head dims in whole 64s take CodeBlocks
// (decode_8bit_blocks.h), which keep the conversion's own order. AVX512-VBMI: decode_rows_bf16 takes this path
// only where the CPU has it.
struct Cache8BitRows : ByteTableRegs {
  using ByteTableRegs::ByteTableRegs;

  template <bool kMasked>
  __m512i chunk(const c10::BFloat16* row, int64_t d, __mmask32 mask) const {
    const uint8_t* x = reinterpret_cast<const uint8_t*>(row) + d;
    return natural_half(convert(_mm512_maskz_loadu_epi8(kMasked ? __mmask64(mask) : __mmask64(0xFFFFFFFFu), x)), 0);
  }
};

// The even and odd elements of a chunk as float32 vectors.
struct EvenOdd {
  __m512 even, odd;
};
inline EvenOdd widen_even_odd(__m512i raw) {
  return {_mm512_castsi512_ps(_mm512_slli_epi32(raw, 16)),
          _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

// acc + the pair products of a and b, lane by lane (vdpbf16ps: 32 bfloat16 products summed into 16 float32
// lanes). Inline assembly, as Bf16PairPanel's: the AVX-512 copy must still load on CPUs without AVX512-BF16.
inline __m512 add_pair_products(__m512 acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// The two ways chunk_score_block multiplies a chunk of 32 key values into a row's accumulator:
// float32 FMAs on the widened even and odd elements, q (scaled) float32 in even / odd chunk order
// (bf16_permute_row)...
struct WidenedProducts {
  static constexpr bool kPairValues = false;  // P V: float32 FMAs on widened values (bf16_value_block)
  using q_t = float;
  using QChunk = EvenOdd;
  static QChunk load_q(const float* q) { return {_mm512_loadu_ps(q), _mm512_loadu_ps(q + 16)}; }
  static EvenOdd key(__m512i raw) { return widen_even_odd(raw); }
  static __m512 multiply_add(const QChunk& q, const EvenOdd& k, __m512 acc) {
    return _mm512_fmadd_ps(q.odd, k.odd, _mm512_fmadd_ps(q.even, k.even, acc));
  }
};

// ... or vdpbf16ps on the chunk as loaded, q (unscaled) bfloat16 in the natural order: one instruction, no widening.
struct PairProducts {
  static constexpr bool kPairValues = true;  // P V on pairs of keys too (bf16_value_block_pairs)
  using q_t = c10::BFloat16;
  using QChunk = __m512i;
  static QChunk load_q(const c10::BFloat16* q) { return _mm512_loadu_si512(q); }
  static __m512i key(__m512i raw) { return raw; }
  static __m512 multiply_add(QChunk q, __m512i k, __m512 acc) { return add_pair_products(acc, q, k); }
};

template <int RB, int KB>
inline void zero_accumulators(__m512 (&acc)[RB][KB]) {
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      acc[r][j] = _mm512_setzero_ps();
    }
  }
}

// s[r * lds + j] = scale * (q_r . key_j) for RB rows and KB keys (RB * KB <= 16: one store_lane_sums tree); q
// [RB, ldq] as Products takes it, zero past dim; the last partial chunk of keys by a masked load.
template <typename Products, int RB, int KB, typename Rows>
inline void chunk_score_block(const typename Products::q_t* q, int64_t ldq, int64_t dim,
                              const c10::BFloat16* const* keys, float scale, float* s, int64_t lds, const Rows& rows) {
  __m512 acc[RB][KB];
  zero_accumulators(acc);
  const auto chunk = [&](int64_t d, auto masked, __mmask32 mask) {
    typename Products::QChunk qc[RB];
    ATTN_OPS_UNROLL
    for (int r = 0; r < RB; ++r) {
      qc[r] = Products::load_q(q + r * ldq + d);
    }
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      const auto kc = Products::key(rows.template chunk<decltype(masked)::value>(keys[j], d, mask));
      ATTN_OPS_UNROLL
      for (int r = 0; r < RB; ++r) {
        acc[r][j] = Products::multiply_add(qc[r], kc, acc[r][j]);
      }
    }
  };
  int64_t d = 0;
  for (; d + kBf16Chunk <= dim; d += kBf16Chunk) {
    chunk(d, std::false_type{}, __mmask32(0));
  }
  if (d < dim) {
    chunk(d, std::true_type{}, chunk_mask(dim - d));
  }
  store_lane_sums<RB, KB>(acc, s, lds, scale);
}

// Loads (or stores) the P V blocks' RB x N accumulators: row r, vector i at o[r * ldo + 16 * i].
template <int RB, int N>
inline void block_accumulators(float* o, int64_t ldo, __m512 (&acc)[RB][N], bool store) {
  ATTN_OPS_UNROLL
  for (int r = 0; r < RB; ++r) {
    ATTN_OPS_UNROLL
    for (int i = 0; i < N; ++i) {
      if (store) {
        _mm512_storeu_ps(o + r * ldo + 16 * i, acc[r][i]);
      } else {
        acc[r][i] = _mm512_loadu_ps(o + r * ldo + 16 * i);
      }
    }
  }
}

// o[r * ldo + chunk c] += sum_j p[r * ldp + j] * value_j[chunk c] for RB rows, NC chunks from column d0 (a
// multiple of 32), j < n; o in even / odd chunk order. kMaskedLast: the last chunk is partial (its `mask`).
template <int RB, int NC, bool kMaskedLast, typename Rows>
inline void bf16_value_block(const float* p, int64_t ldp, const c10::BFloat16* const* values, int64_t n, int64_t d0,
                             __mmask32 mask, float* o, int64_t ldo, const Rows& rows) {
  __m512 acc[RB][2 * NC];
  block_accumulators<RB, 2 * NC>(o + d0, ldo, acc, /*store=*/false);
  for (int64_t j = 0; j < n; ++j) {
    EvenOdd v[NC];
    ATTN_OPS_UNROLL
    for (int c = 0; c < NC; ++c) {
      const int64_t d = d0 + c * kBf16Chunk;
      v[c] = widen_even_odd(kMaskedLast && c == NC - 1 ? rows.template chunk<true>(values[j], d, mask)
                                                       : rows.template chunk<false>(values[j], d, mask));
    }
    ATTN_OPS_UNROLL
    for (int r = 0; r < RB; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ldp + j]);
      ATTN_OPS_UNROLL
      for (int c = 0; c < NC; ++c) {
        acc[r][2 * c] = _mm512_fmadd_ps(pr, v[c].even, acc[r][2 * c]);
        acc[r][2 * c + 1] = _mm512_fmadd_ps(pr, v[c].odd, acc[r][2 * c + 1]);
      }
    }
  }
  block_accumulators<RB, 2 * NC>(o + d0, ldo, acc, /*store=*/true);
}

// (w[0], w[1]) as the low and high half of every 32-bit lane: two keys' weights for vdpbf16ps.
inline __m512i broadcast_weight_pair(const c10::BFloat16* w) {
  int32_t pair;
  std::memcpy(&pair, w, sizeof(pair));
  return _mm512_set1_epi32(pair);
}

// The P V of bf16_value_block on pairs of keys (vdpbf16ps), p in bfloat16: o[r * ldo + chunk c] += sum_j
// p[r * ldp + j] * value_j[chunk c], j < n; p [RB, ldp] zero at column n when n is odd. Each step takes keys j and
// j + 1: vpunpcklwd / vpunpckhwd of their 32-column chunks put the two keys' values of columns {0-3, 8-11,
// 16-19, 24-27} (lo) and {4-7, 12-15, 20-23, 28-31} (hi) side by side as pairs, and one vdpbf16ps per 16 columns
// multiplies them by the broadcast pair (p_j, p_j+1): 16 instructions per key and 4 rows at a head dim of 128
// against the widened path's 32 FMAs and 8 widenings. o keeps that pair order (bf16_unpermute_row).
template <int RB, int NC, bool kMaskedLast, typename Rows>
inline void bf16_value_block_pairs(const c10::BFloat16* p, int64_t ldp, const c10::BFloat16* const* values, int64_t n,
                                   int64_t d0, __mmask32 mask, float* o, int64_t ldo, const Rows& rows) {
  __m512 acc[RB][2 * NC];
  block_accumulators<RB, 2 * NC>(o + d0, ldo, acc, /*store=*/false);
  const auto load = [&](const c10::BFloat16* row, int c) {
    const int64_t d = d0 + c * kBf16Chunk;
    return kMaskedLast && c == NC - 1 ? rows.template chunk<true>(row, d, mask)
                                      : rows.template chunk<false>(row, d, mask);
  };
  for (int64_t j = 0; j < n; j += 2) {
    __m512i lo[NC], hi[NC];
    ATTN_OPS_UNROLL
    for (int c = 0; c < NC; ++c) {
      const __m512i first = load(values[j], c);
      const __m512i second = j + 1 < n ? load(values[j + 1], c) : _mm512_setzero_si512();  // odd n: a zero key
      lo[c] = _mm512_unpacklo_epi16(first, second);
      hi[c] = _mm512_unpackhi_epi16(first, second);
    }
    ATTN_OPS_UNROLL
    for (int r = 0; r < RB; ++r) {
      const __m512i pr = broadcast_weight_pair(p + r * ldp + j);
      ATTN_OPS_UNROLL
      for (int c = 0; c < NC; ++c) {
        acc[r][2 * c] = add_pair_products(acc[r][2 * c], pr, lo[c]);
        acc[r][2 * c + 1] = add_pair_products(acc[r][2 * c + 1], pr, hi[c]);
      }
    }
  }
  block_accumulators<RB, 2 * NC>(o + d0, ldo, acc, /*store=*/true);
}

// dst[0, dim) = src (float32, dim rounded up to chunks, in even / odd chunk order, or with pair_order in
// bf16_value_block_pairs' order) in the natural order.
inline void bf16_unpermute_row(const float* src, float* dst, int64_t dim, bool pair_order) {
  // where the natural columns 0-15 (lo) and 16-31 (hi) of a chunk are in the two halves of its 32 values
  const __m512i lo = pair_order ? _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23)
                                : _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = pair_order ? _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31)
                                : _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t d = 0; d < dim; d += kBf16Chunk) {
    const __m512 even = _mm512_loadu_ps(src + d), odd = _mm512_loadu_ps(src + d + 16);
    const int64_t rest = dim - d;
    _mm512_mask_storeu_ps(dst + d, static_cast<__mmask16>(chunk_mask(std::min<int64_t>(rest, 16))),
                          _mm512_permutex2var_ps(even, lo, odd));
    if (rest > 16) {
      _mm512_mask_storeu_ps(dst + d + 16, static_cast<__mmask16>(chunk_mask(rest - 16)),
                            _mm512_permutex2var_ps(even, hi, odd));
    }
  }
}

// dst[0, padded) = src[0, dim) (float32, natural order) in even / odd chunk order, zero past dim.
inline void bf16_permute_row(const float* src, float* dst, int64_t dim) {
  for (int64_t d = 0; d < padded_to_chunks(dim); ++d) {
    const int64_t c = d / kBf16Chunk * kBf16Chunk, i = d % kBf16Chunk;
    const int64_t from = c + (i < 16 ? 2 * i : 2 * (i - 16) + 1);
    dst[d] = from < dim ? src[from] : 0.f;
  }
}

// What the blocks of the bfloat16 kernels share: 4 rows a block, 16 / RB keys per score block, and the weights
// of P V on pairs in bfloat16 (rounded as SDPA's and the prefill kernels' P), a zero after an odd n.
struct PairBlocksBase {
  static constexpr int kRowBlock = 4;
  static constexpr int64_t kPairsLd = kDecodeChunk + 2;  // bfloat16 weights per row for the pairs (n + 1, even)

  template <int RB>
  static constexpr int score_keys() {
    return 16 / RB;
  }

  // out [RB, kPairsLd] = p [RB, ldp] in bfloat16 over n <= kDecodeChunk keys, zero at column n.
  template <int RB>
  static void weights_in_pairs(const float* p, int64_t ldp, int64_t n, c10::BFloat16* out) {
    TORCH_INTERNAL_ASSERT(n <= kDecodeChunk);
    for (int r = 0; r < RB; ++r) {
      convert_row(p + r * ldp, out + r * kPairsLd, n);
      out[r * kPairsLd + n] = c10::BFloat16(0.f);
    }
  }
};

// decode_rows' blocks for a bfloat16 cache, or an 8-bit one read through Cache8BitRows (see the top of this file).
// acc: the output accumulators [heads, rows, padded dim_v] in even / odd chunk order; q: [heads, rows, padded
// dim_qk] as Products takes it, the scores multiplied by a.q_factor(head) where q is the caller's (unscaled_q), by
// 1 where q carries that factor.
template <typename Products, typename Rows = Bf16Rows>
struct Bf16Blocks : PairBlocksBase {  // 4 rows x 2 chunks x (even, odd) = 16 P V accumulators
  const DecodeRows<c10::BFloat16, float>& a;
  float* acc;
  int64_t ld_acc;
  const typename Products::q_t* q;
  bool unscaled_q;
  Rows rows;

  template <int RB, int KB>
  void scores(int64_t head, int64_t r0, const c10::BFloat16* const* keys, float* s, int64_t lds) const {
    const int64_t ldq = padded_to_chunks(a.dim_qk);
    chunk_score_block<Products, RB, KB>(q + (head * a.rows + r0) * ldq, ldq, a.dim_qk, keys,
                                        unscaled_q ? a.q_factor(head) : 1.f, s, lds, rows);
  }

  template <int RB>
  void values(int64_t head, int64_t r0, const float* p, int64_t ldp, const c10::BFloat16* const* vrows,
              int64_t n) const {
    const int64_t Dv = a.dim_v, chunks = padded_to_chunks(Dv) / kBf16Chunk;
    float* o = acc + (head * a.rows + r0) * ld_acc;
    c10::BFloat16 p_pairs[Products::kPairValues ? RB * kPairsLd : 1];
    if constexpr (Products::kPairValues) {
      weights_in_pairs<RB>(p, ldp, n, p_pairs);
    }
    const __mmask32 last = chunk_mask(Dv - (chunks - 1) * kBf16Chunk);
    const bool partial = Dv % kBf16Chunk != 0;
    for (int64_t c = 0; c < chunks; c += 2) {
      const int64_t d0 = c * kBf16Chunk;
      const bool masked = partial && c + 2 >= chunks;
      const auto run = [&](auto nc, auto m) {
        if constexpr (Products::kPairValues) {
          bf16_value_block_pairs<RB, decltype(nc)::value, decltype(m)::value>(p_pairs, kPairsLd, vrows, n, d0, last,
                                                                              o, ld_acc, rows);
        } else {
          bf16_value_block<RB, decltype(nc)::value, decltype(m)::value>(p, ldp, vrows, n, d0, last, o, ld_acc, rows);
        }
      };
      if (c + 1 < chunks) {
        masked ? run(std::integral_constant<int, 2>{}, std::true_type{})
               : run(std::integral_constant<int, 2>{}, std::false_type{});
      } else {
        masked ? run(std::integral_constant<int, 1>{}, std::true_type{})
               : run(std::integral_constant<int, 1>{}, std::false_type{});
      }
    }
  }
};

}  // namespace
}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS

#include "attention/cpu/decode_8bit_blocks.h"  // after PairBlocksBase and Cache8BitRows

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {

// Whether Q K^T runs on bfloat16 pairs: where vdpbf16ps issues at the FMA's rate, twice its products (Zen 4,
// which has no AMX). Sapphire Rapids class CPUs issue it at half that rate (a tie with the FMAs, and the kernel
// ran 9% slower on it); they have AMX, so the pairs are taken where AVX512-BF16 is and AMX is not, the rule of the
// prefill kernels. The pairs keep q at half the bytes of the float32 copy, in the data the core must hold in
// L1 while the cache streams past (zen4_decode_overlap.md).
inline bool decode_scores_on_pairs() { return cpu_has_avx512bf16() && !cpu_has_amx_bf16(); }

// decode_rows for a bfloat16 cache: stream_tiles with Bf16Blocks.
inline void decode_rows_bf16(const DecodeRows<c10::BFloat16, float>& a) {
  const int64_t all_rows = a.heads * a.rows, Dqk = a.dim_qk, Dv = a.dim_v;
  const int64_t ld_q = padded_to_chunks(Dqk), ld_acc = padded_to_chunks(Dv);
  float* acc = a.stream_scratch;            // [heads, rows, ld_acc]
  float* q_perm = acc + all_rows * ld_acc;  // [heads, rows, ld_q]
  // An 8-bit cache read in registers (Cache8BitRows) where the CPU has VBMI and each item is one KV head, whose
  // rows stream_tiles prefetches and never touches (staged reads would load a bfloat16 row's bytes past an 8-bit
  // row's end): locate then points at the cache rows themselves (converted_keys null).
  const bool in_registers = a.rows_8bit != Cache8Bit::none && a.heads == 1 && cpu_has_avx512vbmi();
  const Cache8BitRows rows_8bit(a.rows_8bit == Cache8Bit::e5m2 ? byte_tables<Cache8Bit::e5m2, c10::BFloat16>()
                                                               : byte_tables<Cache8Bit::e4m3fn, c10::BFloat16>());
  DecodeRows<c10::BFloat16, float> raw = a;
  raw.converted_keys = raw.converted_values = nullptr;
  const auto stream = [&](const auto& blocks, const auto& blocks_8bit) {
    if (in_registers) {
      stream_tiles(raw, blocks_8bit, acc, ld_acc);
    } else {
      stream_tiles(a, blocks, acc, ld_acc);
    }
  };
  // Q K^T and P V on pairs (which also sets the order of acc's columns: bf16_unpermute_row)
  const bool pairs = decode_scores_on_pairs() && multiply_unscaled_q(a.scale);
  if (in_registers && pairs && Dqk % kCodeBlock == 0 && Dv % kCodeBlock == 0) {  // 64 codes a load
    auto* q_codes = reinterpret_cast<c10::BFloat16*>(q_perm);  // [heads, rows, Dqk]
    for (int64_t r = 0; r < all_rows; ++r) {
      arrange_q_for_codes(a.q + r * Dqk, q_codes + r * Dqk, Dqk, a.q_factor(r / a.rows));
    }
    stream_tiles(raw, CodeBlocks{{}, a, acc, q_codes, rows_8bit}, acc, Dv);
    for (int64_t r = 0; r < all_rows; ++r) {
      natural_order_of_values(acc + r * Dv, a.out + r * Dv, Dv);
    }
    return;
  }
  if (pairs) {
    // q as the caller gave it: a.q / a.q_factor restores its bfloat16 values, the factor goes on the sums
    auto* q_pairs = reinterpret_cast<c10::BFloat16*>(q_perm);  // [heads, rows, ld_q], half of q_perm's bytes
    for (int64_t r = 0; r < all_rows; ++r) {
      for (int64_t d = 0; d < ld_q; ++d) {
        q_pairs[r * ld_q + d] = d < Dqk ? c10::BFloat16(a.q[r * Dqk + d] / a.q_factor(r / a.rows))
                                        : c10::BFloat16(0.f);
      }
    }
    stream(Bf16Blocks<PairProducts>{{}, a, acc, ld_acc, q_pairs, true, {}},
           Bf16Blocks<PairProducts, Cache8BitRows>{{}, a, acc, ld_acc, q_pairs, true, rows_8bit});
  } else {
    for (int64_t r = 0; r < all_rows; ++r) {
      bf16_permute_row(a.q + r * Dqk, q_perm + r * ld_q, Dqk);
    }
    stream(Bf16Blocks<WidenedProducts>{{}, a, acc, ld_acc, q_perm, false, {}},
           Bf16Blocks<WidenedProducts, Cache8BitRows>{{}, a, acc, ld_acc, q_perm, false, rows_8bit});
  }
  for (int64_t r = 0; r < all_rows; ++r) {
    bf16_unpermute_row(acc + r * ld_acc, a.out + r * Dv, Dv, pairs);
  }
}

}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS

#endif  // CPU_CAPABILITY_AVX512
