// The scores of an additive-attention problem: s = sum_a w[a] tanh(q[a] + k[a]) for a (query, key) pair,
// optionally keeping t[a] = tanh(q[a] + k[a]) for the backward. The vectorized loops over the hidden
// dimension (score_kernels.h) are compiled once per instruction set (score_isa_*.cpp); AdditiveScorer
// takes the copy of the best one this CPU has.
#pragma once

#include "common/cpu_isa.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace attn_ops::cpu {

// One instruction set's score loops, indexed by whether they store t (score_kernels.h describes them).
template <typename acc_t>
struct AdditiveScoreFns {
  acc_t (*tanh_form[2])(const acc_t* q, const acc_t* k, const acc_t* w, acc_t* t, int64_t hidden);
  acc_t (*exp_form[2])(const acc_t* q, const acc_t* k, const acc_t* eq, const acc_t* ek, const acc_t* w, acc_t* t,
                       int64_t hidden);
};

#define ATTN_OPS_DECLARE_ADDITIVE_SCORE(ns) \
  namespace ns {                            \
  template <typename acc_t>                 \
  AdditiveScoreFns<acc_t> score_fns();      \
  }
ATTN_OPS_DECLARE_ADDITIVE_SCORE(additive_default)
#ifdef ATTN_OPS_X86_ISA_COPIES
ATTN_OPS_DECLARE_ADDITIVE_SCORE(additive_avx2)
#endif
#undef ATTN_OPS_DECLARE_ADDITIVE_SCORE

// The score loops of the best instruction set this CPU has (common/cpu_isa.h), AVX2 at most: with an
// AVX-512 copy, two identical backward calls differed in the last bit now and then (gradcheck's
// reentrancy check failed in about one run in five; the cause is not found), so there is none.
template <typename acc_t>
AdditiveScoreFns<acc_t> score_fns_for_this_cpu() {
#ifdef ATTN_OPS_X86_ISA_COPIES
  if (cpu_isa() != CpuIsa::kDefault) {
    return additive_avx2::score_fns<acc_t>();
  }
#endif
  return additive_default::score_fns<acc_t>();
}

// Largest |q|, |k| for which exp(2 q) stays finite and nonzero in acc_t (exp(80) < FLT_MAX).
template <typename acc_t>
constexpr acc_t exp_limit() {
  return std::is_same_v<acc_t, double> ? acc_t(300) : acc_t(40);
}

// The scores of one problem. Batch entries whose |qp|, |kp| stay within exp_limit use the exp form
// (precomputed exponentials); the others (and NaN) take the tanh form.
template <typename acc_t>
class AdditiveScorer {
 public:
  // qp [batch, query_len, hidden], kp [batch, key_len, hidden], w [hidden]: acc_t, contiguous.
  AdditiveScorer(const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w)
      : eq_(at::exp(qp * 2)), ek_(at::exp(kp * 2)), hidden_(qp.size(2)), query_len_(qp.size(1)),
        key_len_(kp.size(1)), q_(qp.const_data_ptr<acc_t>()), k_(kp.const_data_ptr<acc_t>()),
        w_(w.const_data_ptr<acc_t>()), fns_(score_fns_for_this_cpu<acc_t>()) {
    const int64_t B = qp.size(0);
    if (B > 0 && hidden_ > 0) {
      const at::Tensor q_ok = query_len_ ? qp.abs().amax({1, 2}).le(exp_limit<acc_t>()) : at::ones({B}, at::kBool);
      const at::Tensor k_ok = key_len_ ? kp.abs().amax({1, 2}).le(exp_limit<acc_t>()) : at::ones({B}, at::kBool);
      const at::Tensor ok = q_ok.logical_and(k_ok).contiguous();
      fast_.assign(ok.const_data_ptr<bool>(), ok.const_data_ptr<bool>() + B);
    } else {
      fast_.assign(B, false);
    }
  }

  // Score of query row `row` (b * query_len + i) and key `key` (b * key_len + j) of batch entry b.
  template <bool kStore>
  acc_t pair(int64_t b, int64_t row, int64_t key, acc_t* t) const {
    if (fast_[b]) {
      return fns_.exp_form[kStore](q_ + row * hidden_, k_ + key * hidden_, eq_.const_data_ptr<acc_t>() + row * hidden_,
                                   ek_.const_data_ptr<acc_t>() + key * hidden_, w_, t, hidden_);
    }
    return fns_.tanh_form[kStore](q_ + row * hidden_, k_ + key * hidden_, w_, t, hidden_);
  }

 private:
  at::Tensor eq_, ek_;  // exp(2 qp), exp(2 kp)
  int64_t hidden_, query_len_, key_len_;
  const acc_t *q_, *k_, *w_;
  std::vector<bool> fast_;
  AdditiveScoreFns<acc_t> fns_;
};

// max that lets NaN through (std::max(m, NaN) would drop it and hide a NaN input).
template <typename acc_t>
inline acc_t nan_max(acc_t m, acc_t s) {
  return s <= m ? m : s;
}

}  // namespace attn_ops::cpu
