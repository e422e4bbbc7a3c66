// The decode row kernel for AVX2 + FMA + F16C, compiled for them whatever the build's flags (the
// pragma comes before any include, so at::vec's AVX2 code and everything inlined into it use them);
// decode_cpu.cpp calls it only where the CPU has them.
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c")
// GCC's target pragma enables the instructions but not their feature macros, which the headers test.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#undef CPU_CAPABILITY
#undef CPU_CAPABILITY_AVX2
#undef CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#define ATTN_OPS_DECODE_NS decode_avx2
#include "attention/cpu/decode_kernel.h"
#endif
