// Which copy of a per-instruction-set CPU kernel runs (the copies: files that include cpu_isa_target.h).
#pragma once

namespace attn_ops {

// x86-64 builds with a GCC-compatible compiler also carry AVX2 and AVX-512 copies of the vector kernels.
#if defined(__x86_64__) && defined(__GNUC__)
#define ATTN_OPS_X86_ISA_COPIES 1
#endif

enum class CpuIsa { kDefault, kAvx2, kAvx512 };

// The best instruction set this CPU has as PyTorch sees it (at::get_cpu_capability(), which
// ATEN_CPU_CAPABILITY lowers), lowered further by ATTN_OPS_CPU_ISA=default|avx2|avx512 when set (read at
// every call, so tests can run each copy in one process; a level above the CPU's is never taken).
CpuIsa cpu_isa();

// Whether the AVX-512 copy may use AVX512-BF16's float -> bfloat16 conversion: the CPU has it (checked at
// run time, never assumed by the build), cpu_isa() is kAvx512, and ATTN_OPS_CPU_AVX512BF16 is not 0 (read at
// every call, so tests run both conversions in one process).
bool cpu_has_avx512bf16();

// Whether the AVX-512 copy may run AMX-BF16 tile instructions (attention/cpu/amx_tiles.h): the CPU has them,
// the OS granted this process the tile state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM), requested once),
// cpu_isa() is kAvx512, and ATTN_OPS_CPU_AMX is not 0 (read at every call, for tests and comparisons).
bool cpu_has_amx_bf16();

// `entity` (a function, or a call of one) from the copy cpu_isa() picks, out of the namespaces
// <family>_default / <family>_avx2 / <family>_avx512 that a kernel family's *_isa_<isa>.cpp files define:
// ATTN_OPS_FOR_THIS_CPU(prefill, prefill_kernels<float>()) is prefill_avx512::prefill_kernels<float>()
// on an AVX-512 CPU.
#ifdef ATTN_OPS_X86_ISA_COPIES
#define ATTN_OPS_FOR_THIS_CPU(family, ...)          \
  [&] {                                             \
    switch (::attn_ops::cpu_isa()) {                \
      case ::attn_ops::CpuIsa::kAvx512:             \
        return family##_avx512::__VA_ARGS__;        \
      case ::attn_ops::CpuIsa::kAvx2:               \
        return family##_avx2::__VA_ARGS__;          \
      case ::attn_ops::CpuIsa::kDefault:            \
        break;                                      \
    }                                               \
    return family##_default::__VA_ARGS__;           \
  }()
#else
#define ATTN_OPS_FOR_THIS_CPU(family, ...) family##_default::__VA_ARGS__
#endif

}  // namespace attn_ops
