// The decode row kernel for AVX2 + FMA + F16C, compiled for them whatever the build's flags (the
// target header comes before any include, so at::vec's AVX2 code and everything inlined into it use them);
// decode_cpu.cpp calls it only where the CPU has them.
#define ATTN_OPS_TARGET_AVX2
#include "common/cpu_isa_target.h"
#if ATTN_OPS_ISA_COMPILED
#define ATTN_OPS_DECODE_NS decode_avx2
#include "attention/cpu/decode_kernel.h"
#endif
