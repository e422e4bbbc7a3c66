// The additive score of one (query, key) pair, vectorized over the hidden dimension:
// s = sum_a w[a] tanh(q[a] + k[a]), optionally keeping t[a] = tanh(q[a] + k[a]) for the backward.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace attn_ops::cpu {

// q, k, w, t: [hidden]; t is written only when kStore.
template <bool kStore, typename acc_t>
inline acc_t additive_score(const acc_t* q, const acc_t* k, const acc_t* w, acc_t* t, int64_t hidden) {
  using Vec = at::vec::Vectorized<acc_t>;
  Vec acc(acc_t(0));
  int64_t a = 0;
  for (; a + Vec::size() <= hidden; a += Vec::size()) {
    const Vec x = (Vec::loadu(q + a) + Vec::loadu(k + a)).tanh();
    if constexpr (kStore) {
      x.store(t + a);
    }
    acc = at::vec::fmadd(Vec::loadu(w + a), x, acc);
  }
  acc_t s = at::vec::vec_reduce_all<acc_t>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; a < hidden; ++a) {
    const acc_t x = std::tanh(q[a] + k[a]);
    if constexpr (kStore) {
      t[a] = x;
    }
    s += w[a] * x;
  }
  return s;
}

// The same score from eq = exp(2 q) and ek = exp(2 k), since tanh(x) = 1 - 2 / (exp(2x) + 1):
// s = sum(w) - 2 sum_a w[a] / (eq[a] ek[a] + 1), a multiply, an add and a division per element instead of
// a tanh. Exact in floating point as long as eq and ek are finite and nonzero (|q|, |k| <= exp_limit):
// their product may then overflow to inf (t = 1) or underflow to 0 (t = -1), as tanh saturates.
template <bool kStore, typename acc_t>
inline acc_t additive_score_exp(const acc_t* eq, const acc_t* ek, const acc_t* w, acc_t w_sum, acc_t* t,
                                int64_t hidden) {
  using Vec = at::vec::Vectorized<acc_t>;
  const Vec one(acc_t(1)), two(acc_t(2));
  Vec acc(acc_t(0));
  int64_t a = 0;
  for (; a + Vec::size() <= hidden; a += Vec::size()) {
    const Vec r = one / at::vec::fmadd(Vec::loadu(eq + a), Vec::loadu(ek + a), one);
    if constexpr (kStore) {
      at::vec::fnmadd(two, r, one).store(t + a);  // 1 - 2 r
    }
    acc = at::vec::fmadd(Vec::loadu(w + a), r, acc);
  }
  acc_t s = at::vec::vec_reduce_all<acc_t>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; a < hidden; ++a) {
    const acc_t r = acc_t(1) / (eq[a] * ek[a] + acc_t(1));
    if constexpr (kStore) {
      t[a] = acc_t(1) - 2 * r;
    }
    s += w[a] * r;
  }
  return w_sum - 2 * s;
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
        w_(w.const_data_ptr<acc_t>()), w_sum_(w.sum().item<acc_t>()) {
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
      return additive_score_exp<kStore, acc_t>(eq_.const_data_ptr<acc_t>() + row * hidden_,
                                               ek_.const_data_ptr<acc_t>() + key * hidden_, w_, w_sum_, t, hidden_);
    }
    return additive_score<kStore, acc_t>(q_ + row * hidden_, k_ + key * hidden_, w_, t, hidden_);
  }

 private:
  at::Tensor eq_, ek_;  // exp(2 qp), exp(2 kp)
  int64_t hidden_, query_len_, key_len_;
  const acc_t *q_, *k_, *w_;
  acc_t w_sum_;
  std::vector<bool> fast_;
};

// max that lets NaN through (std::max(m, NaN) would drop it and hide a NaN input).
template <typename acc_t>
inline acc_t nan_max(acc_t m, acc_t s) {
  return s <= m ? m : s;
}

}  // namespace attn_ops::cpu
