// The CPU attention problem: the validated arguments turned into plain integers and element offsets, so
// the forward and backward kernels address any BSHD or varlen layout (any strides but the last dim).
#pragma once

#include "attention/validation.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attn_ops::cpu {

// Addressing of a [sequence, token, head, dim] tensor: element offset of (token i, head h) of sequence b.
struct SeqLayout {
  std::vector<int64_t> base;  // [batch]: offset of token 0, head 0
  int64_t seq_stride = 0;
  int64_t head_stride = 0;
  int64_t at(int64_t b, int64_t i, int64_t h) const { return base[b] + i * seq_stride + h * head_stride; }
};

struct AttentionProblem {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, group = 0, dim_qk = 0, dim_v = 0;
  double scale = 1.0, softcap = 0.0;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded; causal already folded into window_right
  std::vector<int64_t> len_q, len_k;            // [batch]
  std::vector<int64_t> token_q;                 // [batch]: index of the sequence's first query token
  int64_t total_q = 0;                          // query tokens over all sequences

  // The keys query i of sequence b sees: [key_lo, key_hi], empty when key_lo > key_hi.
  int64_t key_lo(int64_t b, int64_t i) const {
    return window_left < 0 ? 0 : std::max<int64_t>(0, i + len_k[b] - len_q[b] - window_left);
  }
  int64_t key_hi(int64_t b, int64_t i) const {
    return window_right < 0 ? len_k[b] - 1 : std::min<int64_t>(len_k[b] - 1, i + len_k[b] - len_q[b] + window_right);
  }
  // The queries of sequence b that see any key in [k_first, k_last]: [first, last], empty when first > last.
  int64_t query_first(int64_t b, int64_t k_first) const {
    return window_right < 0 ? 0 : std::max<int64_t>(0, k_first - (len_k[b] - len_q[b]) - window_right);
  }
  int64_t query_last(int64_t b, int64_t k_last) const {
    return window_left < 0 ? len_q[b] - 1
                           : std::min<int64_t>(len_q[b] - 1, k_last - (len_k[b] - len_q[b]) + window_left);
  }
};

AttentionProblem make_problem(const AttentionShape& shape, const AttentionOptions& opts);






template <typename scalar_t, typename acc_t>
void attention_forward_kernel(const AttentionProblem& p,
                              const scalar_t* q, const SeqLayout& q_layout,  // [b, Tq, Hq, Dqk]
                              const scalar_t* k, const SeqLayout& k_layout,  // [b, Tk, Hkv, Dqk]
                              const scalar_t* v, const SeqLayout& v_layout,  // [b, Tk, Hkv, Dv]
                              scalar_t* out, const SeqLayout& out_layout,    // [b, Tq, Hq, Dv]
                              acc_t* lse, const SeqLayout& lse_layout);      // [b, Hq, Tq]

template <typename scalar_t, typename acc_t>
void attention_backward_kernel(const AttentionProblem& p,
                               const scalar_t* dout, const SeqLayout& dout_layout,  // [b, Tq, Hq, Dv]
                               const scalar_t* q, const SeqLayout& q_layout,        // [b, Tq, Hq, Dqk]
                               const scalar_t* k, const SeqLayout& k_layout,        // [b, Tk, Hkv, Dqk]
                               const scalar_t* v, const SeqLayout& v_layout,        // [b, Tk, Hkv, Dv]
                               const scalar_t* out, const SeqLayout& out_layout,    // [b, Tq, Hq, Dv]
                               const acc_t* lse, const acc_t* dlse, const SeqLayout& lse_layout,  // [b, Hq, Tq]
                               scalar_t* dq, const SeqLayout& dq_layout,            // [b, Tq, Hq, Dqk]
                               scalar_t* dk, const SeqLayout& dk_layout,            // [b, Tk, Hkv, Dqk]
                               scalar_t* dv, const SeqLayout& dv_layout);           // [b, Tk, Hkv, Dv]

}  // namespace attn_ops::cpu
