// The decode row kernel for AVX-512 (F, BW, VL, DQ, as at::vec's AVX512 level), compiled for it whatever
// the build's flags; decode_cpu.cpp calls it only where the CPU has it.
// The headers whose inline code the rest of the library shares come first, so that code stays portable
// (common/cpu_isa_target.h): compiled after the target pragma, the BLAS wrappers of blas.h became weak
// symbols with AVX-512 bodies that the linker could pick for the whole library.
#include "common/cpu/intrinsics_quiet.h"  // first: before any header includes <immintrin.h>
#include "common/cpu/blas.h"
#include "attention/cpu/decode_cpu.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#define ATTN_OPS_TARGET_AVX512
#include "common/cpu_isa_target.h"
#if ATTN_OPS_ISA_COMPILED
#define ATTN_OPS_DECODE_NS decode_avx512
#include "attention/cpu/decode_kernel.h"
#include "attention/cpu/decode_gemm_kernel.h"
#include "attention/cpu/decode_cache_8bit.h"
#endif
