// The vectorized score loops of additive attention (score.h), compiled once per instruction set by
// score_isa_*.cpp, which set the target (common/cpu_isa_target.h) and ATTN_OPS_ADDITIVE_NS first.
#pragma once

#include "additive/cpu/score.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

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

// Below this |x|, tanh(x) comes from its Taylor polynomial to x^9 (next term 1382 x^11 / 155925: relative error
// under the type's epsilon), since 1 - 2 / (exp(2x) + 1) keeps only an absolute error of about epsilon there.
template <typename acc_t>
constexpr acc_t small_tanh_limit() {
  return std::is_same_v<acc_t, double> ? acc_t(0.04) : acc_t(0.25);
}

// tanh(x) = x (1 - x^2/3 + 2 x^4/15 - 17 x^6/315 + 62 x^8/2835) for |x| < small_tanh_limit.
template <typename acc_t, typename T>  // T: acc_t or at::vec::Vectorized<acc_t>
inline T small_tanh(T x) {
  const T x2 = x * x;
  T p = T(acc_t(62.0 / 2835.0));
  p = p * x2 + T(acc_t(-17.0 / 315.0));
  p = p * x2 + T(acc_t(2.0 / 15.0));
  p = p * x2 + T(acc_t(-1.0 / 3.0));
  p = p * x2 + T(acc_t(1));
  return x * p;
}

// The same score from eq = exp(2 q) and ek = exp(2 k), since tanh(x) = 1 - 2 / (exp(2x) + 1) and
// exp(2 (q + k)) = eq ek: a multiply, an add and a division per element instead of a tanh. Valid while eq and
// ek are finite and nonzero (|q|, |k| <= exp_limit): their product may then overflow to inf (t = 1) or
// underflow to 0 (t = -1), as tanh saturates. That form's error is absolute (about epsilon), so near x = 0,
// where tanh is small, it was many times a float32 tanh's: elements with |q + k| < small_tanh_limit take the
// polynomial instead (float32 scores 4-70x over the accuracy rule at |qp|, |kp| ~ 0.05-0.001 before).
template <bool kStore, typename acc_t>
inline acc_t additive_score_exp(const acc_t* q, const acc_t* k, const acc_t* eq, const acc_t* ek, const acc_t* w,
                                acc_t* t, int64_t hidden) {
  using Vec = at::vec::Vectorized<acc_t>;
  const Vec one(acc_t(1)), two(acc_t(2)), limit(small_tanh_limit<acc_t>());
  Vec acc(acc_t(0));
  int64_t a = 0;
  for (; a + Vec::size() <= hidden; a += Vec::size()) {
    const Vec x = Vec::loadu(q + a) + Vec::loadu(k + a);
    const Vec r = one / at::vec::fmadd(Vec::loadu(eq + a), Vec::loadu(ek + a), one);
    const Vec y = Vec::blendv(at::vec::fnmadd(two, r, one), small_tanh<acc_t>(x), x.abs() < limit);  // 1 - 2 r, or poly
    if constexpr (kStore) {
      y.store(t + a);
    }
    acc = at::vec::fmadd(Vec::loadu(w + a), y, acc);
  }
  acc_t s = at::vec::vec_reduce_all<acc_t>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; a < hidden; ++a) {
    const acc_t x = q[a] + k[a];
    const acc_t y = std::abs(x) < small_tanh_limit<acc_t>() ? small_tanh<acc_t>(x)
                                                           : acc_t(1) - 2 * (acc_t(1) / (eq[a] * ek[a] + acc_t(1)));
    if constexpr (kStore) {
      t[a] = y;
    }
    s += w[a] * y;
  }
  return s;
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
