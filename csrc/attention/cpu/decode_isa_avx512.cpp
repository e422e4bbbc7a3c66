// The decode row kernel for AVX-512 (F, BW, VL, DQ, as at::vec's AVX512 level), compiled for it whatever
// the build's flags; decode_cpu.cpp calls it only where the CPU has it.
#define ATTN_OPS_TARGET_AVX512
#include "common/cpu_isa_target.h"
#if ATTN_OPS_ISA_COMPILED
#define ATTN_OPS_DECODE_NS decode_avx512
#include "attention/cpu/decode_kernel.h"
#endif
