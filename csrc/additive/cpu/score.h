// The additive score of one (query, key) pair, vectorized over the hidden dimension:
// s = sum_a w[a] tanh(q[a] + k[a]), optionally keeping t[a] = tanh(q[a] + k[a]) for the backward.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace attn_ops::cpu {

// float32 accumulation for every dtype but float64.
template <typename scalar_t>
using additive_acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

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

// max that lets NaN through (std::max(m, NaN) would drop it and hide a NaN input).
template <typename acc_t>
inline acc_t nan_max(acc_t m, acc_t s) {
  return s <= m ? m : s;
}

}  // namespace attn_ops::cpu
