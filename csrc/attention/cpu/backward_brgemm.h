// The bfloat16 backward's tile products on PyTorch's brgemm (oneDNN's AMX kernels) with float32
// accumulation, as SDPA's CPU backward; backward_tiles.h takes this path in the AVX-512 copy where the
// CPU has AMX-BF16 (lowp_brgemm_available). float16 keeps the float32 path: its brgemm needs AMX-FP16.
//
// Per key block (n keys, padded with zero keys to `width` = n rounded up to kPackBlock) and query tile
// (`rows` rows = positions x group heads; the row dimension of Q^T / dO^T / P / dS is padded to kRowsPad):
//   S    [rows, width] = Q  [rows, Dqk] . K^T            K^T, V^T and K packed once per key block
//   dP   [rows, width] = dO [rows, Dv]  . V^T
//   P, scale * dS rounded to bfloat16, written row by row: as rows (dS) and in brgemm's packed layout
//   dV^T [Dv, width]  += dO^T [Dv, rows]  . P            Q^T and dO^T transposed once per call
//   dK^T [Dqk, width] += Q^T  [Dqk, rows] . dS
//   dQ   [rows, Dqk]   = dS [rows, width] . K
// dK and dV accumulate transposed: brgemm's A operand is row-major and P / dS come out row by row, so
// P^T / dS^T would cost two transposes per tile; Q^T / dO^T cost one per call and the accumulators one
// per key block.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/blas.h"
#include "attention/cpu/packed_kv.h"
#include "attention/cpu/row_ops.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

// The bits of c10::BFloat16(x) (round to nearest even, NaN stays NaN), written so that loops vectorize.
inline uint32_t bfloat16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// dst[0, n) = bfloat16(mult * src).
inline void round_row(const float* src, float mult, int64_t n, c10::BFloat16* dst) {
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t j = 0; j < n; ++j) {
    out[j] = static_cast<uint16_t>(bfloat16_bits(mult * src[j]));
  }
}

// Rows r and r + 1 (r even) of a [k, width] brgemm B operand, bfloat16(mult * a) and bfloat16(mult * b)
// (b == nullptr: zeros; a == nullptr too: both zeros), into its packed layout: column blocks of
// kPackBlock, each [k / 2, kPackBlock, 2] (lowp_brgemm_pack's), i.e. 32-bit pairs (row r, row r + 1) at
// pair-row r / 2.
inline void pack_row_pair(const float* a, const float* b, float mult, int64_t r, int64_t k, int64_t width,
                          c10::BFloat16* packed) {
  uint32_t* out = reinterpret_cast<uint32_t*>(packed);
  for (int64_t c = 0; c < width; c += kPackBlock) {
    uint32_t* dst = out + c * (k / 2) + (r / 2) * kPackBlock;
    if (a == nullptr) {
      std::fill(dst, dst + kPackBlock, 0u);
    } else if (b != nullptr) {
      for (int64_t j = 0; j < kPackBlock; ++j) {
        dst[j] = bfloat16_bits(mult * a[c + j]) | (bfloat16_bits(mult * b[c + j]) << 16);
      }
    } else {
      for (int64_t j = 0; j < kPackBlock; ++j) {
        dst[j] = bfloat16_bits(mult * a[c + j]);
      }
    }
  }
}

// Q^T [Dqk, width] and dO^T [Dv, width] of every query tile (sequence b, KV head g, `positions` query
// positions from a multiple of `positions`): column r is the tile's row r (position i0 + r / G, head
// g * G + r % G), zero past the sequence's end and up to `width` (even). One read of Q and dO per call.
class TransposedQueryTiles {
 public:
  TransposedQueryTiles(const AttentionProblem& p, int64_t positions, int64_t width, const c10::BFloat16* q,
                       const SeqLayout& q_layout, const c10::BFloat16* dout, const SeqLayout& dout_layout)
      : positions_(positions), width_(width), dqk_(p.dim_qk), dv_(p.dim_v), heads_kv_(p.heads_kv),
        first_tile_(p.batch + 1, 0) {
    for (int64_t b = 0; b < p.batch; ++b) {
      first_tile_[b + 1] = first_tile_[b] + p.heads_kv * ((p.len_q[b] + positions - 1) / positions);
    }
    const int64_t total = first_tile_[p.batch], G = p.group;
    q_.assign(total * dqk_ * width_, c10::BFloat16(0));
    dout_.assign(total * dv_ * width_, c10::BFloat16(0));
    at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
      for (int64_t index = begin; index < end; ++index) {
        const int64_t b = std::upper_bound(first_tile_.begin(), first_tile_.end(), index) - first_tile_.begin() - 1;
        const int64_t local = index - first_tile_[b], g = local % heads_kv_, i0 = (local / heads_kv_) * positions;
        const int64_t rows = std::min(positions, p.len_q[b] - i0) * G;
        c10::BFloat16* qt = q_.data() + index * dqk_ * width_;
        c10::BFloat16* dot = dout_.data() + index * dv_ * width_;
        for (int64_t r = 0; r < rows; ++r) {
          const c10::BFloat16* q_row = q + q_layout.at(b, i0 + r / G, g * G + r % G);
          const c10::BFloat16* dout_row = dout + dout_layout.at(b, i0 + r / G, g * G + r % G);
          for (int64_t d = 0; d < dqk_; ++d) {
            qt[d * width_ + r] = q_row[d];
          }
          for (int64_t d = 0; d < dv_; ++d) {
            dot[d * width_ + r] = dout_row[d];
          }
        }
      }
    });
  }

  const c10::BFloat16* q_t(int64_t b, int64_t g, int64_t i0) const { return q_.data() + index(b, g, i0) * dqk_ * width_; }
  const c10::BFloat16* dout_t(int64_t b, int64_t g, int64_t i0) const {
    return dout_.data() + index(b, g, i0) * dv_ * width_;
  }

 private:
  int64_t index(int64_t b, int64_t g, int64_t i0) const { return first_tile_[b] + (i0 / positions_) * heads_kv_ + g; }

  int64_t positions_, width_, dqk_, dv_, heads_kv_;
  std::vector<int64_t> first_tile_;  // [batch + 1]: index of sequence b's first tile
  std::vector<c10::BFloat16> q_, dout_;
};

// One worker's buffers: the packed operands and transposed accumulators of a key block, one query tile's
// rows, scores, gradients and their bfloat16 forms.
struct BrgemmBackwardScratch {
  std::vector<c10::BFloat16> unpacked, k_t, v_t, k, q, dout, p_packed, ds_packed, ds;
  std::vector<float> dk_t, dv_t, scores, probs, dscores;
  BrgemmBackwardScratch(int64_t rows_pad, int64_t key_block, int64_t dqk, int64_t dv)
      : unpacked(std::max(dqk, dv) * key_block), k_t(dqk * key_block), v_t(dv * key_block), k(key_block * dqk),
        q(rows_pad * dqk), dout(rows_pad * dv), p_packed(rows_pad * key_block), ds_packed(rows_pad * key_block),
        ds(rows_pad * key_block), dk_t(dqk * key_block), dv_t(dv * key_block), scores(rows_pad * key_block),
        probs(rows_pad * key_block), dscores(rows_pad * key_block) {}
};

// Packs the key block [k0, k0 + n) of one KV head (rows k_rows / v_rows, row strides ldk / ldv) for the
// three products that read it: K^T [Dqk, width] and V^T [Dv, width] in key blocks of kPackBlock, K [width,
// Dqk] in dim blocks of kPackBlock (block c at k + c * width); keys past n are zero.
inline void pack_key_block(const c10::BFloat16* k_rows, int64_t ldk, const c10::BFloat16* v_rows, int64_t ldv,
                           int64_t n, int64_t width, int64_t dqk, int64_t dv, BrgemmBackwardScratch& s) {
  auto pack_transposed = [&](const c10::BFloat16* src, int64_t ld, int64_t dim, c10::BFloat16* out) {
    c10::BFloat16* t = s.unpacked.data();  // [dim, width]
    for (int64_t d = 0; d < dim; ++d) {
      std::fill(t + d * width + n, t + (d + 1) * width, c10::BFloat16(0));
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t d = 0; d < dim; ++d) {
        t[d * width + j] = src[j * ld + d];
      }
    }
    for (int64_t c = 0; c < width; c += kPackBlock) {
      lowp_brgemm_pack(dim, kPackBlock, width, t + c, out + c * dim);
    }
  };
  pack_transposed(k_rows, ldk, dqk, s.k_t.data());
  pack_transposed(v_rows, ldv, dv, s.v_t.data());
  c10::BFloat16* t = s.unpacked.data();  // [width, Dqk]
  for (int64_t j = 0; j < n; ++j) {
    std::copy_n(k_rows + j * ldk, dqk, t + j * dqk);
  }
  std::fill(t + n * dqk, t + width * dqk, c10::BFloat16(0));
  for (int64_t c = 0; c < dqk; c += kPackBlock) {
    lowp_brgemm_pack(width, kPackBlock, dqk, t + c, s.k.data() + c * width);
  }
}

// The call-level state of the bfloat16 backward on brgemm: its inputs, the transposed query tiles, and
// the work of one (sequence, KV head, key block).
class BrgemmBackward {
 public:
  // Dqk in whole pack blocks (dQ = dS K packs K in dim blocks), Dv even, and a CPU with AMX-BF16.
  static bool supports(const AttentionProblem& p) {
    return p.dim_qk % kPackBlock == 0 && p.dim_v % 2 == 0 && lowp_brgemm_available<c10::BFloat16>();
  }

  // `positions` query positions per tile (rows = positions x group heads), `key_block` keys per key block
  // (a multiple of kPackBlock); delta [total_q * Hq] is the rows' softmax-Jacobian term (backward_tiles.h).
  BrgemmBackward(const AttentionProblem& p, int64_t positions, int64_t key_block, const c10::BFloat16* dout,
                 const SeqLayout& dout_layout, const c10::BFloat16* q, const SeqLayout& q_layout,
                 const c10::BFloat16* k, const SeqLayout& k_layout, const c10::BFloat16* v,
                 const SeqLayout& v_layout, const float* lse, const SeqLayout& lse_layout, const float* delta,
                 c10::BFloat16* dk, const SeqLayout& dk_layout, c10::BFloat16* dv, const SeqLayout& dv_layout)
      : p_(p), positions_(positions), key_block_(key_block), rows_pad_(round_up(positions * p.group, 2)),
        dout_(dout), dout_layout_(dout_layout), q_(q), q_layout_(q_layout), k_(k), k_layout_(k_layout), v_(v),
        v_layout_(v_layout), lse_(lse), lse_layout_(lse_layout), delta_(delta), dk_(dk), dk_layout_(dk_layout),
        dv_(dv), dv_layout_(dv_layout), tiles_(p, positions, rows_pad_, q, q_layout, dout, dout_layout) {}

  BrgemmBackwardScratch scratch() const { return BrgemmBackwardScratch(rows_pad_, key_block_, p_.dim_qk, p_.dim_v); }

  // dK and dV of the key block [k0, k0 + key_block) of (sequence b, KV head g), written to dk / dv, and
  // its dQ contributions added to dq_tile(i0): the float [rows, Dqk] accumulator of the query tile from
  // position i0 (row r = position i0 + r / G, head g * G + r % G).
  template <typename DqTile>
  void key_block(int64_t b, int64_t g, int64_t k0, BrgemmBackwardScratch& s, const DqTile& dq_tile) const {
    const int64_t G = p_.group, Hq = p_.heads_q, Dqk = p_.dim_qk, Dv = p_.dim_v, KB = key_block_;
    const int64_t n = std::min(KB, p_.len_k[b] - k0), width = round_up(n, kPackBlock);
    const float scale = static_cast<float>(p_.scale), softcap = static_cast<float>(p_.softcap);
    pack_key_block(k_ + k_layout_.at(b, k0, g), k_layout_.seq_stride, v_ + v_layout_.at(b, k0, g),
                   v_layout_.seq_stride, n, width, Dqk, Dv, s);
    fill_row(s.dk_t.data(), Dqk * KB, 0.f);
    fill_row(s.dv_t.data(), Dv * KB, 0.f);

    const int64_t i_first = p_.query_first(b, k0), i_last = p_.query_last(b, k0 + n - 1);
    for (int64_t i0 = i_first / positions_ * positions_; i0 <= i_last; i0 += positions_) {
      const int64_t rows = std::min(positions_, p_.len_q[b] - i0) * G;
      // Row r is query position i0 + r / G of head g * G + r % G.
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(q_ + q_layout_.at(b, i0 + r / G, g * G + r % G), Dqk, s.q.data() + r * Dqk);
        std::copy_n(dout_ + dout_layout_.at(b, i0 + r / G, g * G + r % G), Dv, s.dout.data() + r * Dv);
      }
      // scores = Q K^T (the scale is applied per row), dscores = dP = dO V^T.
      for (int64_t c = 0; c < width; c += kPackBlock) {
        lowp_brgemm(rows, kPackBlock, Dqk, s.q.data(), Dqk, s.k_t.data() + c * Dqk, kPackBlock, s.scores.data() + c,
                    KB, false);
        lowp_brgemm(rows, kPackBlock, Dv, s.dout.data(), Dv, s.v_t.data() + c * Dv, kPackBlock,
                    s.dscores.data() + c, KB, false);
      }
      for (int64_t r = 0; r < rows_pad_; r += 2) {
        for (int64_t rr = r; rr < std::min(r + 2, rows); ++rr) {
          const int64_t pos = i0 + rr / G, h = g * G + rr % G;
          row_gradients(s.scores.data() + rr * KB, s.probs.data() + rr * KB, s.dscores.data() + rr * KB, n, width,
                        std::max<int64_t>(p_.key_lo(b, pos) - k0, 0), std::min(p_.key_hi(b, pos) - k0, n - 1),
                        lse_[lse_layout_.at(b, pos, h)], delta_[(p_.token_q[b] + pos) * Hq + h], scale, softcap);
          round_row(s.dscores.data() + rr * KB, scale, width, s.ds.data() + rr * KB);
        }
        const float* p0 = r < rows ? s.probs.data() + r * KB : nullptr;
        const float* p1 = r + 1 < rows ? s.probs.data() + (r + 1) * KB : nullptr;
        const float* ds0 = r < rows ? s.dscores.data() + r * KB : nullptr;
        const float* ds1 = r + 1 < rows ? s.dscores.data() + (r + 1) * KB : nullptr;
        pack_row_pair(p0, p1, 1.f, r, rows_pad_, width, s.p_packed.data());
        pack_row_pair(ds0, ds1, scale, r, rows_pad_, width, s.ds_packed.data());
      }
      // dV^T += dO^T P ; dK^T += Q^T (scale dS) ; dQ += (scale dS) K
      const c10::BFloat16* dout_t = tiles_.dout_t(b, g, i0);
      const c10::BFloat16* q_t = tiles_.q_t(b, g, i0);
      for (int64_t c = 0; c < width; c += kPackBlock) {
        lowp_brgemm(Dv, kPackBlock, rows_pad_, dout_t, rows_pad_, s.p_packed.data() + c * rows_pad_, kPackBlock,
                    s.dv_t.data() + c, KB, true);
        lowp_brgemm(Dqk, kPackBlock, rows_pad_, q_t, rows_pad_, s.ds_packed.data() + c * rows_pad_, kPackBlock,
                    s.dk_t.data() + c, KB, true);
      }
      float* dq = dq_tile(i0);
      for (int64_t c = 0; c < Dqk; c += kPackBlock) {
        lowp_brgemm(rows, kPackBlock, width, s.ds.data(), KB, s.k.data() + c * width, kPackBlock, dq + c, Dqk, true);
      }
    }
    at::native::cpublas::brgemm_release();
    for (int64_t j = 0; j < n; ++j) {
      c10::BFloat16* dk_row = dk_ + dk_layout_.at(b, k0 + j, g);
      c10::BFloat16* dv_row = dv_ + dv_layout_.at(b, k0 + j, g);
      for (int64_t d = 0; d < Dqk; ++d) {
        dk_row[d] = c10::BFloat16(s.dk_t[d * KB + j]);
      }
      for (int64_t d = 0; d < Dv; ++d) {
        dv_row[d] = c10::BFloat16(s.dv_t[d * KB + j]);
      }
    }
  }

 private:
  // One query row: raw scores s (before the scale) and dp = dO V^T over `width` keys in; keys [lo, hi]
  // visible (lo > hi: none), the first n real. Leaves the probabilities in prob and the logit gradients
  // in dp (zero past n), as the float32 path computes them.
  static void row_gradients(float* s, float* prob, float* dp, int64_t n, int64_t width, int64_t lo, int64_t hi,
                            float lse, float delta, float scale, float softcap) {
    fill_row(prob, width, 0.f);
    if (lo <= hi && lse != -std::numeric_limits<float>::infinity()) {
      scale_row(s + lo, hi - lo + 1, scale);
      if (softcap > 0) {
        softcap_row(s + lo, hi - lo + 1, softcap);
      }
      std::copy(s + lo, s + hi + 1, prob + lo);
      exp_shift_sum(prob + lo, hi - lo + 1, lse);
    }
    logit_grad_row(prob, s, dp, n, delta, softcap);
    fill_row(dp + n, width - n, 0.f);
  }

  const AttentionProblem& p_;
  int64_t positions_, key_block_, rows_pad_;
  const c10::BFloat16* dout_;
  const SeqLayout& dout_layout_;
  const c10::BFloat16* q_;
  const SeqLayout& q_layout_;
  const c10::BFloat16* k_;
  const SeqLayout& k_layout_;
  const c10::BFloat16* v_;
  const SeqLayout& v_layout_;
  const float* lse_;
  const SeqLayout& lse_layout_;
  const float* delta_;
  c10::BFloat16* dk_;
  const SeqLayout& dk_layout_;
  c10::BFloat16* dv_;
  const SeqLayout& dv_layout_;
  TransposedQueryTiles tiles_;
};

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
