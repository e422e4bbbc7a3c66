// The x86 intrinsic headers, included before anything else by the AVX-512 translation units: GCC 12 reports
// its own AVX-512 intrinsics (avx512fintrin.h's __Y) as used uninitialized once they are inlined into ATen's
// vector code (GCC bug 105593), some 3,000 lines per build. The warnings are silenced for these headers alone:
// they take the diagnostic state in force where they are first included, here.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
