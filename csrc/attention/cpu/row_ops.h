// Vectorized loops over one row of a score tile. at::vec picks AVX-512, AVX2 or scalar code from
// CPU_CAPABILITY, which a file may set itself (the runtime-dispatched decode kernels do): everything here
// lives in an inline namespace named after it, as at::vec does, so each ISA's copy is a distinct symbol.
#pragma once

#include "attention/cpu/alibi_row.h"
#include "attention/cpu/fast_exp.h"
#include "common/acc_type.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace attn_ops::cpu {
inline namespace CPU_CAPABILITY {

template <typename T>
using Vec = at::vec::Vectorized<T>;

template <typename T>
inline Vec<T> vec_exp(const Vec<T>& x) {
  if constexpr (std::is_same_v<T, float>) {
    // exp_u20: ~1 ulp-class accuracy at a fraction of the cost of a full-precision exp, but it clamps
    // its input first, which turns NaN into exp(88.7) ~ 3.4e38: put the NaN back.
    return Vec<float>::blendv(x.exp_u20(), x, x.isnan());
  } else {
    return x.exp();
  }
}

// max(a, b) that propagates NaN (std::max(a, NaN) returns a): a NaN score must reach the output, never
// pass for "no visible key".
template <typename T>
inline T nan_max(T a, T b) {
  return std::isnan(b) ? b : std::max(a, b);
}

// The largest of n values, NaN if any is NaN (at::vec::maximum propagates NaN too).
template <typename T>
inline T row_max(const T* x, int64_t n) {
  constexpr int64_t W = Vec<T>::size();
  T m = -std::numeric_limits<T>::infinity();
  int64_t i = 0;
  if (n >= W) {
    Vec<T> vm(m);
    for (; i + W <= n; i += W) {
      vm = at::vec::maximum(vm, Vec<T>::loadu(x + i));
    }
    m = at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return at::vec::maximum(a, b); }, vm);
  }
  for (; i < n; ++i) {
    m = nan_max(m, x[i]);
  }
  return m;
}

// exp(x): exp_no_nan for float when the caller knows x has no NaN (no_nan), else vec_exp.
template <bool no_nan, typename T>
inline Vec<T> exp_no_nan_or_exact(const Vec<T>& x) {
  if constexpr (no_nan && std::is_same_v<T, float>) {
    return exp_no_nan(x);
  } else {
    return vec_exp(x);
  }
}

// The largest of x[0, n) (n >= 1) into *max; returns whether every value is finite (checked through their
// sum: NaN or inf makes it non-finite; a sum that overflows only sends the caller to its exact path). Two
// accumulators and a plain max: cheaper than row_max's NaN-propagating compare chain.
template <typename T>
inline bool finite_row_max(const T* x, int64_t n, T* max) {
  constexpr int64_t W = Vec<T>::size();
  const Vec<T> lowest(-std::numeric_limits<T>::infinity());
  Vec<T> m0(lowest), m1(lowest), s0(T(0)), s1(T(0));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const Vec<T> a = Vec<T>::loadu(x + i), b = Vec<T>::loadu(x + i + W);
    m0 = max_no_nan(m0, a);
    m1 = max_no_nan(m1, b);
    s0 = s0 + a;
    s1 = s1 + b;
  }
  for (; i < n; i += W) {  // partial vectors: zeros in the unused lanes, -inf for the max
    const int64_t rest = std::min(W, n - i);
    const Vec<T> a = Vec<T>::loadu(x + i, rest);
    m0 = max_no_nan(m0, Vec<T>::set(lowest, a, rest));
    s0 = s0 + a;
  }
  *max = at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return max_no_nan(a, b); }, max_no_nan(m0, m1));
  return std::isfinite(at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return a + b; }, s0 + s1));
}

// x = exp(x - shift) in place; returns the sum of the new values. no_nan: the caller knows that no x - shift
// is NaN (x has no NaN or +inf, shift is finite), which lets float take the faster exp_no_nan.
template <typename T, bool no_nan = false>
inline T exp_shift_sum(T* x, int64_t n, T shift) {
  constexpr int64_t W = Vec<T>::size();
  const Vec<T> vs(shift);
  Vec<T> vsum(T(0));
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const Vec<T> e = exp_no_nan_or_exact<no_nan>(Vec<T>::loadu(x + i) - vs);
    e.store(x + i);
    vsum = vsum + e;
  }
  if constexpr (no_nan) {
    if (i < n) {  // the tail as one partial vector (its other lanes zeroed), not scalar exps
      const int64_t rest = n - i;
      const Vec<T> tail = exp_no_nan_or_exact<no_nan>(Vec<T>::loadu(x + i, rest) - vs);
      const Vec<T> e = Vec<T>::set(Vec<T>(T(0)), tail, rest);
      e.store(x + i, rest);
      vsum = vsum + e;
      i = n;
    }
  }
  T sum = at::vec::vec_reduce_all<T>([](Vec<T>& a, Vec<T>& b) { return a + b; }, vsum);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

// x *= a in place.
template <typename T>
inline void scale_row(T* x, int64_t n, T a) {
  constexpr int64_t W = Vec<T>::size();
  const Vec<T> va(a);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    (Vec<T>::loadu(x + i) * va).store(x + i);
  }
  for (; i < n; ++i) {
    x[i] *= a;
  }
}

// x = cap * tanh(x / cap) in place (logit soft-capping).
template <typename T>
inline void softcap_row(T* x, int64_t n, T cap) {
  constexpr int64_t W = Vec<T>::size();
  const Vec<T> vcap(cap), vinv(T(1) / cap);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    ((Vec<T>::loadu(x + i) * vinv).tanh() * vcap).store(x + i);
  }
  for (; i < n; ++i) {
    x[i] = cap * std::tanh(x[i] / cap);
  }
}

// ALiBi over n scores: x[j] -= slope * |distance - j| (AlibiRow).
template <typename T>
inline void add_alibi_row(T* x, int64_t n, const AlibiRow& alibi) {
  constexpr int64_t W = Vec<T>::size();
  const T slope = static_cast<T>(alibi.slope);
  const Vec<T> vslope(slope), vstep(static_cast<T>(W));
  Vec<T> offset = Vec<T>::arange(static_cast<T>(-alibi.distance), T(1));  // j - distance, exact below 2^24 keys
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    (Vec<T>::loadu(x + i) - offset.abs() * vslope).store(x + i);
    offset = offset + vstep;
  }
  for (; i < n; ++i) {
    x[i] -= slope * std::abs(static_cast<T>(i - alibi.distance));
  }
}

inline void fill_row(float* x, int64_t n, float value) { std::fill(x, x + n, value); }
inline void fill_row(double* x, int64_t n, double value) { std::fill(x, x + n, value); }

// Converts n contiguous values between storage and accumulation types.
template <typename src_t, typename dst_t>
inline void convert_row(const src_t* src, dst_t* dst, int64_t n) {
  if constexpr (std::is_same_v<src_t, dst_t>) {
    std::copy(src, src + n, dst);
  } else {
    at::vec::convert(src, dst, n);
  }
}

// dst += src over n values.
template <typename T>
inline void add_row(T* dst, const T* src, int64_t n) {
  constexpr int64_t W = Vec<T>::size();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    (Vec<T>::loadu(dst + i) + Vec<T>::loadu(src + i)).store(dst + i);
  }
  for (; i < n; ++i) {
    dst[i] += src[i];
  }
}

// Gradient of the logits from the probabilities: ds = p * (dp - delta), times (1 - (s / cap)^2) when the
// logits s were soft-capped (the derivative of cap * tanh(x / cap)). `ds` holds dp on entry. s / cap is
// clamped to [-1, 1]: a capped logit is within it anyway, and a masked key's s is left uncapped (p = 0 there),
// which with a tiny cap overflowed 1 - t^2 to -inf and made 0 * -inf a NaN gradient.
template <typename T>
inline void logit_grad_row(const T* p, const T* s, T* ds, int64_t n, T delta, T cap) {
  constexpr int64_t W = Vec<T>::size();
  const Vec<T> vdelta(delta), vone(T(1)), vminus_one(T(-1)), vinv(cap > 0 ? T(1) / cap : T(0));
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    Vec<T> g = Vec<T>::loadu(p + i) * (Vec<T>::loadu(ds + i) - vdelta);
    if (cap > 0) {
      const Vec<T> t = at::vec::clamp(Vec<T>::loadu(s + i) * vinv, vminus_one, vone);
      g = g * (vone - t * t);
    }
    g.store(ds + i);
  }
  for (; i < n; ++i) {
    T g = p[i] * (ds[i] - delta);
    if (cap > 0) {
      const T t = std::clamp(s[i] / cap, T(-1), T(1));
      g *= T(1) - t * t;
    }
    ds[i] = g;
  }
}

// Whether rows `ld` values apart, each `cols` long, are a matrix a 32-bit BLAS takes in place.
inline bool blas_ld_ok(int64_t ld, int64_t cols) {
  return ld >= cols && ld <= std::numeric_limits<int>::max();
}

// A tile of n consecutive keys of one head as a row-major [n, dim] matrix of acc_t: the tensor itself
// when its type and row stride allow a BLAS operand, else a converted copy in `buffer`. Sets *ld.
template <typename scalar_t, typename acc_t>
const acc_t* load_key_tile(const scalar_t* src, int64_t seq_stride, int64_t n, int64_t dim, acc_t* buffer,
                           int64_t* ld) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    if (blas_ld_ok(seq_stride, dim)) {
      *ld = seq_stride;
      return src;
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    convert_row(src + j * seq_stride, buffer + j * dim, dim);
  }
  *ld = dim;
  return buffer;
}

// Moves a row's running max to new_max: the running sum and the output accumulator acc[dv] are rescaled
// to it. Also taken once NaN appeared (NaN != NaN): NaN spreads to the whole row.
template <typename T>
inline void move_running_max(T new_max, T& run_max, T& run_sum, T* acc, int64_t dv) {
  if (!(run_max == new_max)) {
    const T correction = std::exp(run_max - new_max);  // 0 when run_max is -inf
    run_sum *= correction;
    scale_row(acc, dv, correction);
    run_max = new_max;
  }
}

// One row's online-softmax step over a tile of n scores of which [lo, hi] are visible (lo > hi: none):
// the scores, soft-capped and then given the row's ALiBi, become exp(score - running max) (0 where not
// visible); when the running max moves, the running sum and the row's output accumulator acc[dv] are
// rescaled to it. NaN spreads to the whole row.
template <typename T>
inline void online_softmax_step(T* srow, int64_t n, int64_t lo, int64_t hi, T softcap, const AlibiRow& alibi,
                                T& run_max, T& run_sum, T* acc, int64_t dv) {
  if (lo > hi) {  // no visible key in this tile: the row adds nothing
    fill_row(srow, n, T(0));
    return;
  }
  T* visible = srow + lo;
  const int64_t count = hi - lo + 1;
  if (softcap > 0) {
    softcap_row(visible, count, softcap);
  }
  if (alibi.slope != 0) {
    add_alibi_row(visible, count, alibi.from(lo));
  }
  T tile_max, new_max, tile_sum;
  // The running max is always the row's max so far: a stale one (kept to spare rescaling acc) leaves the
  // tile's largest weights above 1, and where P is rounded to bfloat16 for P V their rounding doubled the
  // output's error (tests/test_tolerance_rule.py).
  if (finite_row_max(visible, count, &tile_max) && std::isfinite(new_max = std::max(run_max, tile_max))) {
    tile_sum = exp_shift_sum<T, true>(visible, count, new_max);
  } else {  // NaN / inf in this tile or an earlier one: the exact path, which spreads NaN
    new_max = nan_max(run_max, row_max(visible, count));
    if (new_max == -std::numeric_limits<T>::infinity()) {  // every visible score so far is -inf: weight 0
      fill_row(srow, n, T(0));                              // each, as a masked key (exp(-inf - -inf) is NaN)
      return;
    }
    tile_sum = exp_shift_sum(visible, count, new_max);
  }
  fill_row(srow, lo, T(0));
  fill_row(srow + hi + 1, n - hi - 1, T(0));
  move_running_max(new_max, run_max, run_sum, acc, dv);
  run_sum += tile_sum;
}

// prob[lo, hi] = exp(scale * s - shift) in lowp_t; returns the sum of the float values. no_nan: no
// scale * s - shift is NaN (exp_no_nan_or_exact); native_bf16: store_lowp's.
template <bool no_nan, bool native_bf16, typename lowp_t>
inline float exp_to_lowp(const float* s, lowp_t* prob, int64_t lo, int64_t hi, float scale, float shift) {
  constexpr int64_t W = Vec<float>::size();
  const Vec<float> vscale(scale), vshift(-shift);
  auto exp_of = [&](const Vec<float>& x) { return exp_no_nan_or_exact<no_nan>(at::vec::fmadd(x, vscale, vshift)); };
  Vec<float> vsum(0.f);
  int64_t i = lo;
  for (; i + 2 * W <= hi + 1; i += 2 * W) {
    const Vec<float> e0 = exp_of(Vec<float>::loadu(s + i)), e1 = exp_of(Vec<float>::loadu(s + i + W));
    vsum = vsum + e0 + e1;
    store_lowp<native_bf16>(e0, e1, prob + i);
  }
  if constexpr (no_nan) {
    if (i <= hi) {  // the tail as partial vectors (their other lanes zeroed), not scalar exps
      const Vec<float> zero(0.f);
      const int64_t rest = hi + 1 - i, rest0 = std::min(rest, W), rest1 = rest - rest0;
      const Vec<float> e0 = Vec<float>::set(zero, exp_of(Vec<float>::loadu(s + i, rest0)), rest0);
      const Vec<float> e1 =
          rest1 > 0 ? Vec<float>::set(zero, exp_of(Vec<float>::loadu(s + i + W, rest1)), rest1) : zero;
      vsum = vsum + e0 + e1;
      store_lowp<native_bf16>(e0, e1, prob + i, rest);
      i = hi + 1;
    }
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec<float>& a, Vec<float>& b) { return a + b; }, vsum);
  for (; i <= hi; ++i) {
    const float e = std::exp(scale * s[i] - shift);
    sum += e;
    prob[i] = static_cast<lowp_t>(e);
  }
  return sum;
}

// online_softmax_step for the low-precision brgemm path, in two passes instead of four: raw scores s[n]
// (before the softmax scale, which must be > 0; no soft-capping) in, the probabilities
// exp(scale * s - running max) out in the input dtype, prob[0, n) (0 where not visible), ready for P V.
// native_bf16: round to bfloat16 with AVX512-BF16 (store_lowp; only where cpu_has_avx512bf16()).
template <typename lowp_t>
inline void online_softmax_step_lowp(const float* s, lowp_t* prob, int64_t n, int64_t lo, int64_t hi, float scale,
                                     float& run_max, float& run_sum, float* acc, int64_t dv, bool native_bf16) {
  if (lo > hi) {  // adds nothing (online_softmax_step)
    std::fill(prob, prob + n, lowp_t(0));
    return;
  }
  float tile_max, new_max, tile_sum;
  if (finite_row_max(s + lo, hi - lo + 1, &tile_max) &&
      std::isfinite(new_max = std::max(run_max, scale * tile_max))) {  // the row's max so far, as above
    tile_sum = native_bf16 ? exp_to_lowp<true, true>(s, prob, lo, hi, scale, new_max)
                           : exp_to_lowp<true, false>(s, prob, lo, hi, scale, new_max);
  } else {  // NaN / inf: the exact path (online_softmax_step)
    new_max = nan_max(run_max, scale * row_max(s + lo, hi - lo + 1));
    if (new_max == -std::numeric_limits<float>::infinity()) {
      std::fill(prob, prob + n, lowp_t(0));
      return;
    }
    tile_sum = exp_to_lowp<false, false>(s, prob, lo, hi, scale, new_max);
  }
  std::fill(prob, prob + lo, lowp_t(0));
  std::fill(prob + hi + 1, prob + n, lowp_t(0));
  move_running_max(new_max, run_max, run_sum, acc, dv);
  run_sum += tile_sum;
}

// Normalizes a finished row's accumulator acc[dv] and returns its log-sum-exp. A row with no visible key
// has sum 0: zeros and lse = -inf. A NaN sum (NaN in q, k or v's scores) stays NaN in both.
template <typename T>
inline T finish_row(T* acc, int64_t dv, T run_max, T run_sum) {
  const bool no_key = run_sum == T(0);
  scale_row(acc, dv, no_key ? T(0) : T(1) / run_sum);
  return no_key ? -std::numeric_limits<T>::infinity() : run_max + std::log(run_sum);
}

// Adds a sink logit to a finished row (normalized acc[dv], its lse): the softmax denominator gains exp(sink),
// so the row scales by exp(lse - lse') with lse' = log(exp(lse) + exp(sink)). A row with no visible key stays
// zeros with lse' = sink; NaN in either stays NaN in both.
template <typename T>
inline T add_sink(T* acc, int64_t dv, T lse, T sink) {
  if (lse == -std::numeric_limits<T>::infinity()) {
    return sink;
  }
  const T top = std::max(lse, sink);
  const T merged = top + std::log(std::exp(lse - top) + std::exp(sink - top));
  scale_row(acc, dv, std::exp(lse - merged));
  return merged;
}

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu
