// Run-time choice of the per-instruction-set CPU kernel copies (cpu_isa.h).
#include "common/cpu_isa.h"

#include <ATen/Version.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attn_ops {
namespace {

// What the CPU (and OS) support, as PyTorch's own kernels see it; read once.
CpuIsa capability_of_this_cpu() {
  static const CpuIsa isa = [] {
#ifdef ATTN_OPS_X86_ISA_COPIES
    const std::string capability = at::get_cpu_capability();
    return capability == "AVX512" ? CpuIsa::kAvx512 : capability == "AVX2" ? CpuIsa::kAvx2 : CpuIsa::kDefault;
#else
    return CpuIsa::kDefault;
#endif
  }();
  return isa;
}

}  // namespace

CpuIsa cpu_isa() {
  const CpuIsa best = capability_of_this_cpu();
  const char* forced = std::getenv("ATTN_OPS_CPU_ISA");
  if (forced == nullptr || *forced == '\0') {
    return best;
  }
  const std::string name = forced;
  TORCH_CHECK(name == "default" || name == "avx2" || name == "avx512",
              "attn_ops: ATTN_OPS_CPU_ISA expected default, avx2 or avx512, got '", name, "'");
  const CpuIsa wanted = name == "avx512" ? CpuIsa::kAvx512 : name == "avx2" ? CpuIsa::kAvx2 : CpuIsa::kDefault;
  return std::min(wanted, best);
}

bool cpu_has_avx512bf16() {
#ifdef ATTN_OPS_X86_ISA_COPIES
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  const char* forced = std::getenv("ATTN_OPS_CPU_AVX512BF16");
  return has && cpu_isa() == CpuIsa::kAvx512 && !(forced != nullptr && std::string(forced) == "0");
#else
  return false;
#endif
}

bool cpu_has_amx_bf16() {
#if defined(ATTN_OPS_X86_ISA_COPIES) && defined(__linux__)
  static const bool has = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("amx-bf16") == 0) {
      return false;
    }
    constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;  // the kernel's ABI (asm/prctl.h)
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
  }();
  const char* forced = std::getenv("ATTN_OPS_CPU_AMX");
  return has && cpu_isa() == CpuIsa::kAvx512 && !(forced != nullptr && std::string(forced) == "0");
#else
  return false;
#endif
}

}  // namespace attn_ops
