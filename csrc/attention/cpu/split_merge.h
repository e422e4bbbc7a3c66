// Merge of the key splits of a flash-decoding forward: each split wrote its rows' normalized output and
// log-sum-exp; the result is their lse-weighted combination. In row_ops.h's inline namespace: each
// instruction set's copy of the kernels that call it has its own.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/row_ops.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

namespace attn_ops::cpu {
inline namespace CPU_CAPABILITY {

// Writes the finished row of head h (acc[dim_v] normalized, in place; row_lse) to out and lse, with the head's
// sink logit when the problem has sinks: the one place a final row is written.
template <typename scalar_t, typename acc_t>
inline void write_row(const AttentionProblem& p, int64_t h, acc_t* acc, acc_t row_lse, scalar_t* out, acc_t* lse) {
  *lse = p.sinks.empty() ? row_lse : add_sink(acc, p.dim_v, row_lse, static_cast<acc_t>(p.sinks[h]));
  convert_row(acc, out, p.dim_v);
}

// lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) out_s. Partial row `row` of split s is at
// s * rows_total + row with row = (token_q[b] + position) * Hq + head, rows_total = total_q * Hq.
template <typename scalar_t, typename acc_t>
void merge_splits(const AttentionProblem& p, int64_t splits,
                  const acc_t* part_out,  // [splits, total_q * Hq, Dv]
                  const acc_t* part_lse,  // [splits, total_q * Hq]
                  scalar_t* out, const SeqLayout& out_layout, acc_t* lse, const SeqLayout& lse_layout) {
  const int64_t Hq = p.heads_q, Dv = p.dim_v, rows_total = p.total_q * Hq;
  const acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
  const std::vector<int64_t> token_batch = p.token_batches();
  at::parallel_for(0, rows_total, 64, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> merged(Dv);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / Hq, h = row % Hq, b = token_batch[t], pos = t - p.token_q[b];
      acc_t max_lse = neg_inf;
      for (int64_t split = 0; split < splits; ++split) {
        max_lse = nan_max(max_lse, part_lse[split * rows_total + row]);
      }
      fill_row(merged.data(), Dv, acc_t(0));
      acc_t total = 0;
      if (max_lse != neg_inf) {
        for (int64_t split = 0; split < splits; ++split) {
          const acc_t weight = std::exp(part_lse[split * rows_total + row] - max_lse);
          total += weight;
          const acc_t* part = part_out + (split * rows_total + row) * Dv;
          for (int64_t d = 0; d < Dv; ++d) {
            merged[d] += weight * part[d];
          }
        }
        scale_row(merged.data(), Dv, acc_t(1) / total);
      }
      write_row(p, h, merged.data(), max_lse == neg_inf ? neg_inf : max_lse + std::log(total),
                out + out_layout.at(b, pos, h), lse + lse_layout.at(b, pos, h));
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu
