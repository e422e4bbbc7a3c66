// The additive-attention score loops on at::vec's portable implementation (what a CPU without AVX2
// runs).
// The headers whose inline code the rest of the library shares come first (common/cpu_isa_target.h).
#include "additive/cpu/score.h"

#include "common/cpu_isa_target.h"
#if ATTN_OPS_ISA_COMPILED
#define ATTN_OPS_ADDITIVE_NS additive_default
#include "additive/cpu/score_kernels.h"
#endif
