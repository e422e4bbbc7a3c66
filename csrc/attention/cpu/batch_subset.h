// Some sequences of an attention problem as a problem of their own, addressing the same tensors: a mixed
// serving batch (decode rows and a prefill chunk in one packed call) runs each kind on its own kernel.
#pragma once

#include "attention/cpu/attention_cpu.h"

#include <cstdint>
#include <vector>

namespace attn_ops::cpu {

// The sequences `seqs` of p, in that order. The query tokens are renumbered 0 .. total_q - 1 (the kernels
// size their per-token scratch by total_q); the layouts keep every sequence's own base offset, so the
// tensors are addressed as before.
struct BatchSubset {
  const std::vector<int64_t>& seqs;
  AttentionProblem problem;

  BatchSubset(const AttentionProblem& p, const std::vector<int64_t>& seqs_) : seqs(seqs_), problem(p) {
    problem.batch = static_cast<int64_t>(seqs.size());
    problem.len_q.clear();
    problem.len_k.clear();
    problem.token_q.clear();
    problem.total_q = 0;
    problem.alibi.clear();
    for (const int64_t b : seqs) {
      if (!p.alibi.empty()) {  // sequence b's slopes [heads_q]
        const auto first = p.alibi.begin() + b * p.heads_q;
        problem.alibi.insert(problem.alibi.end(), first, first + p.heads_q);
      }
      problem.len_q.push_back(p.len_q[b]);
      problem.len_k.push_back(p.len_k[b]);
      problem.token_q.push_back(problem.total_q);
      problem.total_q += p.len_q[b];
    }
  }

  SeqLayout of(const SeqLayout& l) const {
    SeqLayout s = l;
    s.base = pick(l.base);
    return s;
  }
  KeyLayout of(const KeyLayout& l) const {
    KeyLayout s = l;
    s.rows.base = pick(l.rows.base);  // per-sequence vectors: empty when the layout does not use them
    s.table_row = pick(l.table_row);
    s.first_key = pick(l.first_key);
    return s;
  }

 private:
  std::vector<int64_t> pick(const std::vector<int64_t>& per_seq) const {
    std::vector<int64_t> out;
    if (!per_seq.empty()) {
      for (const int64_t b : seqs) {
        out.push_back(per_seq[b]);
      }
    }
    return out;
  }
};

}  // namespace attn_ops::cpu
