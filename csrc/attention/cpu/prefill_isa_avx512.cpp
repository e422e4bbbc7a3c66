// The prefill kernels (tiled attention forward and backward) for AVX-512 (F, BW, VL, DQ), compiled for it
// whatever the build's flags; prefill_cpu.cpp calls them only where the CPU has it.
// The headers whose inline code the rest of the library shares come first, so that code stays portable
// (common/cpu_isa_target.h).
#include "common/cpu/intrinsics_quiet.h"  // first: before any header includes <immintrin.h>
#include "attention/cpu/attention_cpu.h"
#include "common/cpu/blas.h"
#include "common/cpu/parallel.h"
#include "attention/cpu/prefill_kernels.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#define ATTN_OPS_TARGET_AVX512
#include "common/cpu_isa_target.h"
#if ATTN_OPS_ISA_COMPILED
#define ATTN_OPS_PREFILL_NS prefill_avx512
#include "attention/cpu/prefill_isa.h"
#endif
