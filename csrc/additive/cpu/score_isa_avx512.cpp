// The additive-attention score loops for AVX-512 (F, BW, VL, DQ), compiled for it whatever the build's
// flags; score.h calls them only where the CPU has it.
// The headers whose inline code the rest of the library shares come first (common/cpu_isa_target.h).
#include "additive/cpu/score.h"

#define ATTN_OPS_TARGET_AVX512
#include "common/cpu_isa_target.h"
#if ATTN_OPS_ISA_COMPILED
#define ATTN_OPS_ADDITIVE_NS additive_avx512
#include "additive/cpu/score_kernels.h"
#endif
