// Reading 8-bit KV caches (float8_e4m3fn, float8_e5m2) on the CPU: rows converted to the kernels' dtype with
// integer arithmetic that compilers vectorize (no lookup table, no x86 instruction converts these formats),
// independent of the denormal mode. Every 8-bit value is exact in float32, bfloat16 and float16. Compiled
// once per instruction set (the kernels' copies include it after common/cpu_isa_target.h), in the inline
// namespace CPU_CAPABILITY as row_ops.h, so each copy is a distinct symbol.
#pragma once

#include "attention/cpu/attention_cpu.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace attn_ops::cpu {
inline namespace CPU_CAPABILITY {

// The float32 bits of an 8-bit value: sign, exponent rebiased, mantissa shifted; a subnormal (exponent 0) as its
// exact value m * 2^(1 - bias - mantissa bits), a normal float32; e4m3fn's NaN (S.1111.111) and e5m2's
// infinities and NaNs (exponent 31) as float32's.
// Branch-free (masks, not selects) so that the row loops below vectorize.
template <Cache8Bit format>
inline uint32_t float_bits_of_8bit(uint8_t x) {
  constexpr bool e4m3 = format == Cache8Bit::e4m3fn;
  constexpr uint32_t mantissa_bits = e4m3 ? 3 : 2, rebias = e4m3 ? 120 : 112;
  const uint32_t sign = static_cast<uint32_t>(x & 0x80) << 24;
  const uint32_t e = (x & 0x7F) >> mantissa_bits, m = x & ((1u << mantissa_bits) - 1);
  const uint32_t sub = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(m)) * (e4m3 ? 0x1p-9f : 0x1p-16f));
  const uint32_t is_sub = 0u - static_cast<uint32_t>(e == 0);
  uint32_t normal = ((e + rebias) << 23) | (m << (23 - mantissa_bits));
  if constexpr (e4m3) {  // S.1111.111: NaN
    const uint32_t is_nan = 0u - static_cast<uint32_t>((x & 0x7F) == 0x7F);
    normal = (normal & ~is_nan) | (0x7FC00000u & is_nan);
  } else {  // exponent 31: infinity or NaN, float32's exponent 255
    normal |= (0u - static_cast<uint32_t>(e == 31)) & 0x7F800000u;
  }
  return sign | (sub & is_sub) | (normal & ~is_sub);
}

// dst[i] = the value of the 8-bit src[i], i < n, in dst_t (float, c10::BFloat16 or c10::Half): exact.
template <Cache8Bit format, typename dst_t>
inline void dequantize_row(const uint8_t* src, dst_t* dst, int64_t n) {
  if constexpr (std::is_same_v<dst_t, float>) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = float_bits_of_8bit<format>(src[i]);
      std::memcpy(dst + i, &bits, 4);
    }
  } else if constexpr (std::is_same_v<dst_t, c10::BFloat16>) {
    // the low 16 bits of an 8-bit value's float32 are zero: truncation is exact
    uint16_t* out = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<uint16_t>(float_bits_of_8bit<format>(src[i]) >> 16);
    }
  } else {
    static_assert(std::is_same_v<dst_t, c10::Half>);
    uint16_t* out = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (format == Cache8Bit::e5m2) {
        out[i] = static_cast<uint16_t>(src[i]) << 8;  // e5m2 is float16's top byte
      } else {
        // every e4m3fn value (2^-9 .. 448) is a normal float16: rebias the float32 bits (NaN: float16's NaN)
        const uint32_t bits = float_bits_of_8bit<format>(src[i]), magnitude = bits & 0x7FFFFFFF;
        const uint32_t is_zero = 0u - static_cast<uint32_t>(magnitude == 0);
        const uint32_t is_nan = 0u - static_cast<uint32_t>(magnitude > 0x7F800000u);
        const uint32_t half = ((((magnitude >> 13) - (112u << 10)) & ~is_nan) | (0x7E00u & is_nan)) & ~is_zero;
        out[i] = static_cast<uint16_t>((bits >> 16 & 0x8000) | half);
      }
    }
  }
}

// dequantize_row for a format known at run time.
template <typename dst_t>
inline void dequantize_row(Cache8Bit format, const uint8_t* src, dst_t* dst, int64_t n) {
  if (format == Cache8Bit::e4m3fn) {
    dequantize_row<Cache8Bit::e4m3fn>(src, dst, n);
  } else {
    dequantize_row<Cache8Bit::e5m2>(src, dst, n);
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu
