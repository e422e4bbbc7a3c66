// decode_rows' blocks for an 8-bit cache read in registers 64 codes at a time (AVX512-VBMI and AVX512-BF16 pairs;
// head dims in whole 64s). One 64-byte load of a row's codes becomes two vectors of 32 bfloat16
// (cache_8bit.h's ByteTableRegs::convert, about 2.5 instructions per 32 values); the unpacks leave the values in a
// fixed lane order, which the blocks absorb instead of undoing (Cache8BitRows undoes it, one more instruction per 32):
//   - Q K^T: q is rearranged once per call into that order (key_lane_column), so each vdpbf16ps pairs the right
//     columns;
//   - P V: two keys' converted values are interleaved into pairs by 16-bit unpacks, whose order the output
//     accumulators keep (value_lane_column); they are put back in the natural order once, at the end.
// Included by decode_bf16_kernel.h (AVX-512 copies), in its namespace.
#pragma once

#if defined(CPU_CAPABILITY_AVX512)

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {
namespace {

constexpr int64_t kCodeBlock = 64;  // codes per load

// The natural column (within a block of 64) of 16-bit lane m of the first (half 0) or second (half 1) vector a
// block's conversion gives: vpunpcklbw / vpunpckhbw take bytes 0-7 / 8-15 of each 128-bit lane.
constexpr int64_t key_lane_column(int64_t half, int64_t m) { return 16 * (m / 8) + 8 * half + m % 8; }

// The natural column of float32 lane n of P V accumulator i (0-3) of a block: vpunpcklwd / vpunpckhwd of the two
// keys' halves take 16-bit lanes 0-3 / 4-7 of each 128-bit lane.
constexpr int64_t value_lane_column(int64_t i, int64_t n) { return 16 * (n / 4) + 4 * i + n % 4; }

// The bfloat16 values of 64 codes of a row (its byte address), in key_lane_column order.
inline CodeBlock convert_codes(const ByteTableRegs& t, const uint8_t* x) { return t.convert(_mm512_loadu_si512(x)); }

// s[r * lds + j] = scale * (q_r . key_j) for RB rows and KB keys; q [RB, ldq] bfloat16 in key_lane_column order
// per block of 64, zero past dim; dim a multiple of 64.
template <int RB, int KB>
inline void code_score_block(const c10::BFloat16* q, int64_t ldq, int64_t dim, const c10::BFloat16* const* keys,
                             float scale, float* s, int64_t lds, const Cache8BitRows& tables) {
  __m512 acc[RB][KB];
  zero_accumulators(acc);
  for (int64_t d = 0; d < dim; d += kCodeBlock) {
    ATTN_OPS_UNROLL
    for (int j = 0; j < KB; ++j) {
      const CodeBlock k = convert_codes(tables, reinterpret_cast<const uint8_t*>(keys[j]) + d);
      ATTN_OPS_UNROLL
      for (int r = 0; r < RB; ++r) {
        const c10::BFloat16* qr = q + r * ldq + d;
        acc[r][j] = add_pair_products(acc[r][j], _mm512_loadu_si512(qr), k.half[0]);
        acc[r][j] = add_pair_products(acc[r][j], _mm512_loadu_si512(qr + 32), k.half[1]);
      }
    }
  }
  store_lane_sums<RB, KB>(acc, s, lds, scale);
}

// o[r * ldo + d0 + 16 * i + n] += sum_j p[r * ldp + j] * value_j[column (i, n)] for RB rows over the block of 64
// columns from d0, j < n_keys; p bfloat16, zero at column n_keys when it is odd; o in value_lane_column order.
template <int RB>
inline void code_value_block(const c10::BFloat16* p, int64_t ldp, const c10::BFloat16* const* values, int64_t n_keys,
                             int64_t d0, float* o, int64_t ldo, const Cache8BitRows& tables) {
  __m512 acc[RB][4];
  block_accumulators<RB, 4>(o + d0, ldo, acc, /*store=*/false);
  for (int64_t j = 0; j < n_keys; j += 2) {
    const CodeBlock first = convert_codes(tables, reinterpret_cast<const uint8_t*>(values[j]) + d0);
    const CodeBlock second = j + 1 < n_keys
                                 ? convert_codes(tables, reinterpret_cast<const uint8_t*>(values[j + 1]) + d0)
                                 : CodeBlock{{_mm512_setzero_si512(), _mm512_setzero_si512()}};  // odd: a zero key
    const __m512i pairs[4] = {_mm512_unpacklo_epi16(first.half[0], second.half[0]),
                              _mm512_unpackhi_epi16(first.half[0], second.half[0]),
                              _mm512_unpacklo_epi16(first.half[1], second.half[1]),
                              _mm512_unpackhi_epi16(first.half[1], second.half[1])};
    ATTN_OPS_UNROLL
    for (int r = 0; r < RB; ++r) {
      const __m512i pr = broadcast_weight_pair(p + r * ldp + j);
      ATTN_OPS_UNROLL
      for (int i = 0; i < 4; ++i) {
        acc[r][i] = add_pair_products(acc[r][i], pr, pairs[i]);
      }
    }
  }
  block_accumulators<RB, 4>(o + d0, ldo, acc, /*store=*/true);
}

// The blocks of stream_tiles (decode_kernel.h) over 64-code blocks. acc: [heads, rows, dim_v] float32 in
// value_lane_column order; q: [heads, rows, dim_qk] bfloat16 (as the caller gave it) in key_lane_column order, the
// scores multiplied by a.q_factor(head).
struct CodeBlocks : PairBlocksBase {  // 4 rows x 4 accumulators of P V
  const DecodeRows<c10::BFloat16, float>& a;
  float* acc;
  const c10::BFloat16* q;
  Cache8BitRows tables;

  template <int RB, int KB>
  void scores(int64_t head, int64_t r0, const c10::BFloat16* const* keys, float* s, int64_t lds) const {
    code_score_block<RB, KB>(q + (head * a.rows + r0) * a.dim_qk, a.dim_qk, a.dim_qk, keys, a.q_factor(head), s, lds,
                             tables);
  }

  template <int RB>
  void values(int64_t head, int64_t r0, const float* p, int64_t ldp, const c10::BFloat16* const* vrows,
              int64_t n) const {
    c10::BFloat16 p_pairs[RB * kPairsLd];
    weights_in_pairs<RB>(p, ldp, n, p_pairs);
    float* o = acc + (head * a.rows + r0) * a.dim_v;
    for (int64_t d0 = 0; d0 < a.dim_v; d0 += kCodeBlock) {
      code_value_block<RB>(p_pairs, kPairsLd, vrows, n, d0, o, a.dim_v, tables);
    }
  }
};

// q_out[d] (bfloat16, key_lane_column order per block of 64) = q[natural column] / q_divisor for one row.
inline void arrange_q_for_codes(const float* q, c10::BFloat16* q_out, int64_t dim, float q_divisor) {
  for (int64_t d0 = 0; d0 < dim; d0 += kCodeBlock) {
    for (int64_t m = 0; m < kCodeBlock; ++m) {
      q_out[d0 + m] = c10::BFloat16(q[d0 + key_lane_column(m / 32, m % 32)] / q_divisor);
    }
  }
}

// dst[natural column] = src (value_lane_column order per block of 64) for one row.
inline void natural_order_of_values(const float* src, float* dst, int64_t dim) {
  for (int64_t d0 = 0; d0 < dim; d0 += kCodeBlock) {
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t n = 0; n < 16; ++n) {
        dst[d0 + value_lane_column(i, n)] = src[d0 + 16 * i + n];
      }
    }
  }
}

}  // namespace
}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS

#endif  // CPU_CAPABILITY_AVX512
