// CPU backward of attention (FlashAttention-2 order: key blocks outside, query blocks inside). Compiled
// once per instruction set (prefill_isa_*.cpp); prefill_cpu.cpp picks the copy at run time.
//
// One work item is (sequence, KV head, split). A split owns every `splits`-th key block of its
// sequence, accumulates dK/dV of those blocks privately (summed over the group's query heads, no
// races) and adds its dQ contributions into its own float buffer; the buffers are summed at the end
// (with one split of a float32 / float64 problem, into dq itself).
// Splits exist so that a problem with few (sequence, KV head) pairs (MQA, batch 1) still fills every
// thread; the result does not depend on the thread count's schedule (deterministic).
// bfloat16 on a CPU with AMX runs on brgemm instead, with its own work split (backward_brgemm.h); the
// other dtypes and CPUs convert the tiles to float32 / float64 for the BLAS.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/backward_brgemm.h"
#include "common/cpu/blas.h"
#include "common/cpu/parallel.h"
#include "attention/cpu/prefill_kernels.h"
#include "attention/cpu/row_ops.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {
namespace {

constexpr int64_t kBackwardRows = 128;  // query rows (positions of one head) per tile
constexpr int64_t kKeyBlock = 128;    // keys per block
constexpr int64_t kMaxDqBufferBytes = int64_t(1) << 30;

template <typename acc_t>
struct BackwardScratch {
  std::vector<acc_t> q, dout, lse, delta, scores, probs, dscores, k, v, dk, dv, k_t, v_t;
  BackwardScratch(int64_t rows, int64_t dqk, int64_t dv_dim)
      : q(rows * dqk), dout(rows * dv_dim), lse(rows), delta(rows), scores(rows * kKeyBlock),
        probs(rows * kKeyBlock), dscores(rows * kKeyBlock), k(kKeyBlock * dqk),
        v(kKeyBlock * dv_dim), dk(kKeyBlock * dqk), dv(kKeyBlock * dv_dim), k_t(dqk * kKeyBlock),
        v_t(dv_dim * kKeyBlock) {}
};

// dst[d * ld_dst + j] = src[j * ld_src + d]: a [n, dim] tile as [dim, n], in 16 x 16 blocks.
template <typename T>
void transpose_tile(const T* src, int64_t ld_src, int64_t n, int64_t dim, T* dst, int64_t ld_dst) {
  constexpr int64_t kBlock = 16;
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    for (int64_t d0 = 0; d0 < dim; d0 += kBlock) {
      for (int64_t j = j0; j < std::min(n, j0 + kBlock); ++j) {
        for (int64_t d = d0; d < std::min(dim, d0 + kBlock); ++d) {
          dst[d * ld_dst + j] = src[j * ld_src + d];
        }
      }
    }
  }
}

}  // namespace

template <typename scalar_t, typename acc_t>
void backward_tiles(const AttentionProblem& p, const scalar_t* dout, const SeqLayout& dout_layout, const scalar_t* q,
                    const SeqLayout& q_layout, const scalar_t* k, const SeqLayout& k_layout, const scalar_t* v,
                    const SeqLayout& v_layout, const scalar_t* out, const SeqLayout& out_layout, const acc_t* lse,
                    const acc_t* dlse, const SeqLayout& lse_layout, scalar_t* dq, const SeqLayout& dq_layout,
                    scalar_t* dk, const SeqLayout& dk_layout, scalar_t* dv, const SeqLayout& dv_layout) {
  const int64_t G = p.group, Hq = p.heads_q, Dqk = p.dim_qk, Dv = p.dim_v;
  const acc_t scale = static_cast<acc_t>(p.scale), softcap = static_cast<acc_t>(p.softcap);
  const acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();

  // The sequence and position of every packed query token.
  const std::vector<int64_t> token_batch = p.token_batches();
  auto for_each_query_row = [&](const auto& fn) {  // fn(b, position, head, packed row index)
    at::parallel_for(0, p.total_q, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = token_batch[t];
        for (int64_t h = 0; h < Hq; ++h) {
          fn(b, t - p.token_q[b], h, t * Hq + h);
        }
      }
    });
  };

  // delta = rowsum(dout * out) - dlse: the softmax-Jacobian term of every query row.
  std::vector<acc_t> delta(p.total_q * Hq);
  for_each_query_row([&](int64_t b, int64_t i, int64_t h, int64_t row) {
    const scalar_t* dout_row = dout + dout_layout.at(b, i, h);
    const scalar_t* out_row = out + out_layout.at(b, i, h);
    acc_t sum = 0;
    for (int64_t d = 0; d < Dv; ++d) {
      sum += static_cast<acc_t>(dout_row[d]) * static_cast<acc_t>(out_row[d]);
    }
    delta[row] = sum - (dlse ? dlse[lse_layout.at(b, i, h)] : acc_t(0));
  });

  if constexpr (kBrgemmCopy && std::is_same_v<scalar_t, c10::BFloat16>) {
    if (p.total_q > 0 && BrgemmBackward::supports(p)) {
      BrgemmBackward(p, dout, dout_layout, q, q_layout, k, k_layout, v, v_layout, lse, lse_layout, delta.data(), dq,
                     dq_layout, dk, dk_layout, dv, dv_layout)
          .run();
      return;
    }
  }

  int64_t max_key_blocks = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    max_key_blocks = std::max(max_key_blocks, (p.len_k[b] + kKeyBlock - 1) / kKeyBlock);
  }
  const double backward_flops = 2.5 * p.forward_flops();
  const int64_t pairs = std::max<int64_t>(1, p.batch * p.heads_kv);
  const int64_t dq_bytes = std::max<int64_t>(1, p.total_q * Hq * Dqk * static_cast<int64_t>(sizeof(acc_t)));
  const int64_t splits = std::max<int64_t>(
      1, std::min({(2 * parallel_threads(backward_flops) + pairs - 1) / pairs, max_key_blocks,
                   kMaxDqBufferBytes / dq_bytes}));
  // One split of float32 / float64 accumulates into dq itself (the items' rows are disjoint): no
  // buffer the size of dq, which is most of the backward's memory beyond its inputs at long lengths.
  constexpr bool same_type = std::is_same_v<scalar_t, acc_t>;
  const bool direct = same_type && splits == 1 && blas_ld_ok(dq_layout.seq_stride, Dqk);
  // [splits, total_q, Hq, Dqk]
  std::vector<acc_t> dq_partial(direct ? 0 : splits * p.total_q * Hq * Dqk, acc_t(0));
  // The dQ accumulator of (sequence b, position i, head h) in split `split`.
  auto dq_row = [&](int64_t b, int64_t i, int64_t h, int64_t split = 0) -> acc_t* {
    if constexpr (same_type) {
      if (direct) {
        return dq + dq_layout.at(b, i, h);
      }
    }
    return dq_partial.data() + ((split * p.total_q + p.token_q[b] + i) * Hq + h) * Dqk;
  };
  // The distance between dq_row(b, i, h, split) and dq_row(b, i + 1, h, split).
  const int64_t dq_position_stride = direct ? dq_layout.seq_stride : Hq * Dqk;
  if (direct) {
    for_each_query_row([&](int64_t b, int64_t i, int64_t h, int64_t) { fill_row(dq_row(b, i, h), Dqk, acc_t(0)); });
  }

  parallel_items(
      p.batch * p.heads_kv * splits, backward_flops,
      [&] { return BackwardScratch<acc_t>(kBackwardRows, Dqk, Dv); },
      [&](int64_t item, BackwardScratch<acc_t>& s) {
        const int64_t split = item % splits, g = (item / splits) % p.heads_kv, b = item / (splits * p.heads_kv);
        const int64_t Tk = p.len_k[b];
        for (int64_t k0 = split * kKeyBlock; k0 < Tk; k0 += splits * kKeyBlock) {
          const int64_t n = std::min(kKeyBlock, Tk - k0);
          int64_t ldk = 0, ldv = 0;
          const acc_t* kt = load_key_tile(k + k_layout.at(b, k0, g), k_layout.seq_stride, n, Dqk, s.k.data(), &ldk);
          const acc_t* vt = load_key_tile(v + v_layout.at(b, k0, g), v_layout.seq_stride, n, Dv, s.v.data(), &ldv);
          // K^T and V^T: the score products Q K^T and dO V^T as plain (NN) products, faster than NT in MKL.
          transpose_tile(kt, ldk, n, Dqk, s.k_t.data(), kKeyBlock);
          transpose_tile(vt, ldv, n, Dv, s.v_t.data(), kKeyBlock);
          fill_row(s.dk.data(), n * Dqk, acc_t(0));
          fill_row(s.dv.data(), n * Dv, acc_t(0));

          const int64_t i_first = p.query_first(b, k0), i_last = p.query_last(b, k0 + n - 1);
          // One query head of the group at a time: its rows (positions i0 ..) are equally spaced, so float32 /
          // float64 Q and dO are read in place and dQ is accumulated where it lives, no copies.
          for (int64_t h = g * G; h < (g + 1) * G; ++h) {
            for (int64_t i0 = i_first; i0 <= i_last; i0 += kBackwardRows) {
              const int64_t rows = std::min(kBackwardRows, i_last + 1 - i0);  // row r: position i0 + r of head h
              int64_t ldq = 0, ldo = 0;
              const acc_t* qt =
                  load_key_tile(q + q_layout.at(b, i0, h), q_layout.seq_stride, rows, Dqk, s.q.data(), &ldq);
              const acc_t* dot =
                  load_key_tile(dout + dout_layout.at(b, i0, h), dout_layout.seq_stride, rows, Dv, s.dout.data(), &ldo);
              for (int64_t r = 0; r < rows; ++r) {
                s.lse[r] = lse[lse_layout.at(b, i0 + r, h)];
                s.delta[r] = delta[(p.token_q[b] + i0 + r) * Hq + h];
              }
              // scores[rows, n] = scale * Q K^T, soft-capped; probs = exp(scores - lse) on visible keys.
              gemm<acc_t>(false, false, rows, n, Dqk, scale, qt, ldq, s.k_t.data(), kKeyBlock, acc_t(0),
                          s.scores.data(), kKeyBlock);
              for (int64_t r = 0; r < rows; ++r) {
                acc_t* srow = s.scores.data() + r * kKeyBlock;
                acc_t* prow = s.probs.data() + r * kKeyBlock;
                const int64_t pos = i0 + r;
                const int64_t lo = std::max<int64_t>(p.key_lo(b, pos) - k0, 0);
                const int64_t hi = std::min<int64_t>(p.key_hi(b, pos) - k0, n - 1);
                fill_row(prow, n, acc_t(0));
                if (lo > hi || s.lse[r] == neg_inf) {
                  continue;
                }
                if (softcap > 0) {
                  softcap_row(srow + lo, hi - lo + 1, softcap);
                }
                // ALiBi joins the probabilities only: srow keeps the capped logit logit_grad_row needs (the
                // bias does not depend on it).
                std::copy(srow + lo, srow + hi + 1, prow + lo);
                const AlibiRow alibi = p.alibi_row(b, h, pos, k0);
                if (alibi.slope != 0) {
                  add_alibi_row(prow + lo, hi - lo + 1, alibi.from(lo));
                }
                exp_shift_sum(prow + lo, hi - lo + 1, s.lse[r]);
              }
              // dV[n, Dv] += P^T dO ; dP[rows, n] = dO V^T
              gemm<acc_t>(true, false, n, Dv, rows, acc_t(1), s.probs.data(), kKeyBlock, dot, ldo, acc_t(1),
                          s.dv.data(), Dv);
              gemm<acc_t>(false, false, rows, n, Dv, acc_t(1), dot, ldo, s.v_t.data(), kKeyBlock, acc_t(0),
                          s.dscores.data(), kKeyBlock);
              // dS = P * (dP - delta), times d(softcap)/d(logit) = 1 - tanh^2 when capped.
              for (int64_t r = 0; r < rows; ++r) {
                logit_grad_row(s.probs.data() + r * kKeyBlock, s.scores.data() + r * kKeyBlock,
                               s.dscores.data() + r * kKeyBlock, n, s.delta[r], softcap);
              }
              // dK[n, Dqk] += scale * dS^T Q ; dQ[rows, Dqk] += scale * dS K, where dq_row keeps it
              gemm<acc_t>(true, false, n, Dqk, rows, scale, s.dscores.data(), kKeyBlock, qt, ldq, acc_t(1),
                          s.dk.data(), Dqk);
              gemm<acc_t>(false, false, rows, Dqk, n, scale, s.dscores.data(), kKeyBlock, kt, ldk, acc_t(1),
                          dq_row(b, i0, h, split), dq_position_stride);
            }
          }
          for (int64_t j = 0; j < n; ++j) {
            convert_row(s.dk.data() + j * Dqk, dk + dk_layout.at(b, k0 + j, g), Dqk);
            convert_row(s.dv.data() + j * Dv, dv + dv_layout.at(b, k0 + j, g), Dv);
          }
        }
      });

  if (direct) {
    return;
  }
  // dq = sum of the splits' partial sums.
  for_each_query_row([&](int64_t b, int64_t i, int64_t h, int64_t) {
    acc_t* first = dq_row(b, i, h);
    for (int64_t split = 1; split < splits; ++split) {
      add_row(first, dq_row(b, i, h, split), Dqk);
    }
    convert_row(first, dq + dq_layout.at(b, i, h), Dqk);
  });
}

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
