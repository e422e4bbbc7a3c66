// The vectorized score loops of additive attention (score.h), compiled once per instruction set by
// score_isa_*.cpp, which set the target (common/cpu_isa_target.h) and ATTN_OPS_ADDITIVE_NS first.
#pragma once

#include "additive/cpu/score.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstdint>

namespace attn_ops::cpu::ATTN_OPS_ADDITIVE_NS {
namespace {

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

}  // namespace

template <typename acc_t>
AdditiveScoreFns<acc_t> score_fns() {
  return {{&additive_score<false, acc_t>, &additive_score<true, acc_t>},
          {&additive_score_exp<false, acc_t>, &additive_score_exp<true, acc_t>}};
}
template AdditiveScoreFns<float> score_fns<float>();
template AdditiveScoreFns<double> score_fns<double>();

}  // namespace attn_ops::cpu::ATTN_OPS_ADDITIVE_NS
