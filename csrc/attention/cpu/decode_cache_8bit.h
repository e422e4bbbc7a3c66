// One instruction set's conversion of 8-bit cache rows for the decode kernel (decode_cpu.h: locate_rows converts a
// tile's rows with it): included by decode_isa_*.cpp after they set the target and ATTN_OPS_DECODE_NS.
#pragma once

#include "attention/cpu/cache_8bit.h"
#include "attention/cpu/decode_cpu.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {

template <typename scalar_t>
void dequantize_cache_row(Cache8Bit format, const uint8_t* src, scalar_t* dst, int64_t n) {
  dequantize_row(format, src, dst, n);
}

template void dequantize_cache_row<float>(Cache8Bit, const uint8_t*, float*, int64_t);
template void dequantize_cache_row<c10::Half>(Cache8Bit, const uint8_t*, c10::Half*, int64_t);
template void dequantize_cache_row<c10::BFloat16>(Cache8Bit, const uint8_t*, c10::BFloat16*, int64_t);

}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS
