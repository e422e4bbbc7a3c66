// The decode row kernel on at::vec's portable implementation (what a CPU without AVX2 runs).
#include "common/cpu_isa_target.h"
#define ATTN_OPS_DECODE_NS decode_default
#include "attention/cpu/decode_kernel.h"
