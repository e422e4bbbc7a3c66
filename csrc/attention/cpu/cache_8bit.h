// Reading 8-bit KV caches (float8_e4m3fn, float8_e5m2) on the CPU: rows converted to the kernels' dtype with
// integer arithmetic that compilers vectorize (no lookup table, no x86 instruction converts these formats),
// independent of the denormal mode. Every 8-bit value is exact in float32, bfloat16 and float16. Compiled
// once per instruction set (the kernels' copies include it after common/cpu_isa_target.h), in the inline
// namespace CPU_CAPABILITY as row_ops.h, so each copy is a distinct symbol.
#pragma once

#include "attention/cpu/attention_cpu.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
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
  const float sub_value = static_cast<float>(static_cast<int32_t>(m)) * (e4m3 ? 0x1p-9f : 0x1p-16f);
  const uint32_t sub = std::bit_cast<uint32_t>(sub_value);
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

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
// AVX512-VBMI (Ice Lake, Zen 4 and later): each of a 16-bit dtype's two bytes of the 128 magnitudes (the sign is one
// bit) as a byte table, which one vpermi2b reads for 64 values. Exact for every code: the tables are the
// arithmetic's results.
struct ByteTables {
  alignas(64) uint8_t high[128];
  alignas(64) uint8_t low[128];
};

template <Cache8Bit format, typename dst_t>
const ByteTables& byte_tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    for (int x = 0; x < 128; ++x) {
      const uint8_t code = static_cast<uint8_t>(x);
      dst_t value;
      dequantize_row<format>(&code, &value, 1);
      uint16_t bits;
      std::memcpy(&bits, &value, 2);
      t.high[x] = static_cast<uint8_t>(bits >> 8);
      t.low[x] = static_cast<uint8_t>(bits);
    }
    return t;
  }();
  return tables;
}

inline bool cpu_has_avx512vbmi() {
  static const bool has = __builtin_cpu_supports("avx512vbmi");
  return has;
}

// 64 codes' 16-bit values: half[0] holds codes 16k + 0..7, half[1] codes 16k + 8..15 of each 128-bit lane k
// (key_lane_column in decode_8bit_blocks.h), the order the byte unpacks leave.
struct CodeBlock {
  __m512i half[2];
};

// The byte tables in registers, and the conversion every 8-bit reader shares: two vpermi2b (the low and the high
// byte of each value), one vpternlog (the sign) and two byte unpacks per 64 codes. vpermi2b is written as inline
// assembly, as vdpbf16ps, so the AVX-512 copy loads on CPUs without VBMI; callers take it only where
// cpu_has_avx512vbmi().
struct ByteTableRegs {
  __m512i high0, high1, low0, low1;

  explicit ByteTableRegs(const ByteTables& t)
      : high0(_mm512_load_si512(t.high)), high1(_mm512_load_si512(t.high + 64)), low0(_mm512_load_si512(t.low)),
        low1(_mm512_load_si512(t.low + 64)) {}

  CodeBlock convert(__m512i codes) const {
    __m512i low = codes, high = codes;  // vpermi2b: index bit 6 picks the table half, bit 7 (the sign) is ignored
    asm("vpermi2b %2, %1, %0" : "+v"(low) : "v"(low0), "v"(low1));
    asm("vpermi2b %2, %1, %0" : "+v"(high) : "v"(high0), "v"(high1));
    // high | (codes & 0x80): the sign bit of each value's high byte
    high = _mm512_ternarylogic_epi32(high, codes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
    return {{_mm512_unpacklo_epi8(low, high), _mm512_unpackhi_epi8(low, high)}};
  }
};

// Values 0..31 (which = 0) or 32..63 (which = 1) of a CodeBlock in the natural order.
inline __m512i natural_half(const CodeBlock& b, int which) {
  const __m512i order = which == 0 ? _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0)
                                   : _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  return _mm512_permutex2var_epi64(b.half[0], order, b.half[1]);
}

// dst[i] = the 16-bit (bfloat16 / float16) bits of src[i], i < n, through the tables.
inline void dequantize_row_vbmi(const uint8_t* src, uint16_t* dst, int64_t n, const ByteTables& t) {
  const ByteTableRegs regs(t);
  for (int64_t i = 0; i < n; i += 64) {
    const int64_t m = std::min<int64_t>(64, n - i);
    const __mmask64 in_mask = m == 64 ? ~__mmask64(0) : (__mmask64(1) << m) - 1;
    const CodeBlock b = regs.convert(_mm512_maskz_loadu_epi8(in_mask, src + i));
    const __mmask32 first_mask = m >= 32 ? ~__mmask32(0) : (__mmask32(1) << m) - 1;
    const __mmask32 second_mask = m == 64 ? ~__mmask32(0) : m <= 32 ? 0 : (__mmask32(1) << (m - 32)) - 1;
    _mm512_mask_storeu_epi16(dst + i, first_mask, natural_half(b, 0));
    _mm512_mask_storeu_epi16(dst + i + 32, second_mask, natural_half(b, 1));
  }
}
#endif

// dequantize_row for a format known at run time (16-bit outputs through the byte tables where the CPU has VBMI).
template <typename dst_t>
inline void dequantize_row(Cache8Bit format, const uint8_t* src, dst_t* dst, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
  if constexpr (!std::is_same_v<dst_t, float>) {
    if (cpu_has_avx512vbmi()) {
      const ByteTables& tables = format == Cache8Bit::e4m3fn ? byte_tables<Cache8Bit::e4m3fn, dst_t>()
                                                             : byte_tables<Cache8Bit::e5m2, dst_t>();
      return dequantize_row_vbmi(src, reinterpret_cast<uint16_t*>(dst), n, tables);
    }
  }
#endif
  if (format == Cache8Bit::e4m3fn) {
    dequantize_row<Cache8Bit::e4m3fn>(src, dst, n);
  } else {
    dequantize_row<Cache8Bit::e5m2>(src, dst, n);
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace attn_ops::cpu
