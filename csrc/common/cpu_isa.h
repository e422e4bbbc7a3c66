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

}  // namespace attn_ops
