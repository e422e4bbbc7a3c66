// The decode row kernel on at::vec's portable implementation (what a CPU without AVX2 runs).
#undef CPU_CAPABILITY
#undef CPU_CAPABILITY_AVX2
#undef CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY DEFAULT
#define ATTN_OPS_DECODE_NS decode_default
#include "attention/cpu/decode_kernel.h"
