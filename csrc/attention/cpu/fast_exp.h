// The softmax's exponential and bfloat16 rounding in registers, per instruction set (compiled into each copy
// of the kernels that include row_ops.h, in the inline namespace CPU_CAPABILITY as at::vec).
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace attn_ops::cpu {
inline namespace CPU_CAPABILITY {

// 2^r for |r| <= 1/2: a degree-5 polynomial, <= 2e-7 relative error (as accurate as at::vec's exp_u20).
inline at::vec::Vectorized<float> exp2_fraction(const at::vec::Vectorized<float>& r) {
  using V = at::vec::Vectorized<float>;
  V p = at::vec::fmadd(V(1.3218677e-3f), r, V(9.6717076e-3f));
  p = at::vec::fmadd(p, r, V(5.5508930e-2f));
  p = at::vec::fmadd(p, r, V(2.4022238e-1f));
  p = at::vec::fmadd(p, r, V(6.9314688e-1f));
  return at::vec::fmadd(p, r, V(1.f));
}

// exp(x) for inputs that are not NaN (-inf gives 0): the online softmax's shifted scores, which are NaN-free
// once the row's max is finite. 2^t with t = x log2(e) = n + r, n = round(t), |r| <= 1/2; 2^r by
// exp2_fraction, 2^n added to the exponent. About half the instructions of exp_u20 plus the NaN fix-up that
// vec_exp (row_ops.h) needs.
inline at::vec::Vectorized<float> exp_no_nan(const at::vec::Vectorized<float>& x) {
#if defined(CPU_CAPABILITY_AVX512)
  // t >= -160 keeps -inf from becoming NaN (-inf - -inf); 2^-160 underflows to 0 in scalef.
  const __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _mm512_set1_ps(-160.f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_scalef_ps(exp2_fraction(_mm512_sub_ps(t, n)), n);  // 2^r * 2^n, 0 on underflow
#elif defined(CPU_CAPABILITY_AVX2)
  // t in [-127, 88.8]: n = -127 puts a zero exponent field, i.e. 2^n = 0; exp(88.8) overflows to inf anyway.
  const __m256 t = _mm256_min_ps(
      _mm256_max_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(-127.f)),
      _mm256_set1_ps(128.f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i scale_bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(exp2_fraction(_mm256_sub_ps(t, n)), _mm256_castsi256_ps(scale_bits));
#else
  return x.exp();
#endif
}

// max(a, b) per lane for callers that check for NaN separately: one instruction where at::vec::maximum
// adds a NaN compare and blend.
template <typename T>
inline at::vec::Vectorized<T> max_no_nan(const at::vec::Vectorized<T>& a, const at::vec::Vectorized<T>& b) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_max_ps(a, b);
  }
#elif defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_max_ps(a, b);
  }
#endif
  return at::vec::maximum(a, b);
}

// Stores the first `count` of a and b (2 x Vectorized<float>::size() values, a first) in lowp_t (bfloat16 or
// float16), rounded to nearest even. native_bf16: bfloat16 with AVX512-BF16's vcvtne2ps2bf16 (one instruction
// for 32 values; the caller checked that the CPU has it: cpu_has_avx512bf16()), as inline assembly so that
// the AVX-512 copy keeps running on AVX-512 CPUs without it (a function with that target could not inline
// into the loops). Else at::vec's conversion (bfloat16: rounding in integer arithmetic).
template <bool native_bf16, typename lowp_t>
inline void store_lowp(const at::vec::Vectorized<float>& a, const at::vec::Vectorized<float>& b, lowp_t* dst,
                       int64_t count = 2 * at::vec::Vectorized<float>::size()) {
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
  if constexpr (native_bf16 && std::is_same_v<lowp_t, c10::BFloat16>) {
    __m512i packed;
    // AT&T operand order: src2 (the lower half of the result), src1 (the upper half), destination.
    asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(packed) : "v"(static_cast<__m512>(b)), "v"(static_cast<__m512>(a)));
    if (count == 32) {
      _mm512_storeu_si512(dst, packed);
    } else {
      _mm512_mask_storeu_epi16(dst, static_cast<__mmask32>((uint64_t(1) << count) - 1), packed);
    }
    return;
  }
#endif
  at::vec::convert_from_float<lowp_t>(a, b).store(dst, count);
}

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu
