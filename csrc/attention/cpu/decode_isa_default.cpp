// The decode row kernel on at::vec's portable implementation (what a CPU without AVX2 runs).
// The headers whose inline code the rest of the library shares come first, so that code stays portable
// (common/cpu_isa_target.h): compiled after the target pragma, the BLAS wrappers of blas.h became weak
// symbols with AVX-512 bodies that the linker could pick for the whole library.
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

#include "common/cpu_isa_target.h"
#define ATTN_OPS_DECODE_NS decode_default
#include "attention/cpu/decode_kernel.h"
#include "attention/cpu/decode_gemm_kernel.h"
#include "attention/cpu/decode_cache_8bit.h"
