// The prefill kernels (tiled attention forward and backward) on at::vec's portable implementation,
// what a CPU without AVX2 runs.
// The headers whose inline code the rest of the library shares come first, so that code stays portable
// (common/cpu_isa_target.h).
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

#include "common/cpu_isa_target.h"
#if ATTN_OPS_ISA_COMPILED
#define ATTN_OPS_PREFILL_NS prefill_default
#include "attention/cpu/prefill_isa.h"
#endif
