// The decode row kernel for AVX-512 (F, BW, VL, DQ, as at::vec's AVX512 level), compiled for it whatever
// the build's flags; decode_cpu.cpp calls it only where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
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
#ifndef __AVX512F__
#define __AVX512F__ 1
#endif
#ifndef __AVX512BW__
#define __AVX512BW__ 1
#endif
#ifndef __AVX512VL__
#define __AVX512VL__ 1
#endif
#ifndef __AVX512DQ__
#define __AVX512DQ__ 1
#endif
#undef CPU_CAPABILITY
#undef CPU_CAPABILITY_AVX2
#undef CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#define ATTN_OPS_DECODE_NS decode_avx512
#include "attention/cpu/decode_kernel.h"
#endif
