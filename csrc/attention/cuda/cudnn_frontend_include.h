// cudnn-frontend (header-only, pinned in requirements-build.txt) with its symbols kept private to this library:
// another extension in the process may carry another version of the same inline functions. Entry points are
// loaded at run time (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, set by the build), so the library links neither
// libcudnn nor cudart.
#pragma once

// The C-level headers the frontend includes, first, with their default visibility: only the frontend's own
// declarations become hidden (a libc function such as dlerror declared hidden would not link).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <nvrtc.h>
#if __has_include(<cuda_fp4.h>)
#include <cuda_fp4.h>
#endif

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#pragma GCC visibility push(hidden)
#include <cudnn_frontend.h>
#pragma GCC visibility pop
