// Compiles the rest of a translation unit for one vector instruction set, whatever the build's flags, so
// that one portable binary carries several copies of a CPU kernel and cpu_isa() picks one at run time.
// Define ATTN_OPS_TARGET_AVX2 or ATTN_OPS_TARGET_AVX512 before including it (neither: at::vec's portable
// code); it sets CPU_CAPABILITY, which picks at::vec's implementation and names the inline namespace of
// at::vec and of row_ops.h, so each copy's inline functions are distinct symbols. It sets
// ATTN_OPS_ISA_COMPILED to 1 when this copy exists in this build (always for the portable one; the AVX
// ones on x86-64 with GCC-compatible compilers), to 0 otherwise.
//
// The target pragma applies to every function defined after it: a file includes the headers whose inline
// code it shares with the rest of the library (ATen, the layouts, <vector>) BEFORE this one, so that code
// stays portable; what it includes after is compiled for the target. No include guard: once per file.

#if defined(ATTN_OPS_TARGET_AVX2) || defined(ATTN_OPS_TARGET_AVX512)
#if defined(__x86_64__) && defined(__GNUC__)
#define ATTN_OPS_ISA_COMPILED 1
#if defined(ATTN_OPS_TARGET_AVX512)  // F, BW, VL, DQ: at::vec's AVX512 level
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#else
#pragma GCC target("avx2,fma,f16c")
#endif
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
#if defined(ATTN_OPS_TARGET_AVX512)
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
#endif
#undef CPU_CAPABILITY
#undef CPU_CAPABILITY_AVX2
#undef CPU_CAPABILITY_AVX512
#if defined(ATTN_OPS_TARGET_AVX512)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#else
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif
#else
#define ATTN_OPS_ISA_COMPILED 0
#endif
#else  // the portable copy
#define ATTN_OPS_ISA_COMPILED 1
#undef CPU_CAPABILITY
#undef CPU_CAPABILITY_AVX2
#undef CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY DEFAULT
#endif
