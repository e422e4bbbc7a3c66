// The one place that decides which CUDA backend runs a prepared attention call: cuDNN's fused attention
// (attention/cuda/cudnn_*) where it is allow-listed for the device, the cuDNN version and every option of the
// call, attn_ops' own kernels everywhere else. A plain host function of the call and of facts about the
// device and library, so it is compiled into every build and tested without a GPU (tests/cpp/test_backend_route.cpp).
// ATTN_OPS_ATTENTION_BACKEND=auto|cudnn|native forces a path; cudnn on a case cuDNN does not take is an error
// that names why.
#pragma once

#include "common/attention_call.h"

#include <cstdint>
#include <string>

namespace attn_ops::cuda {

enum class AttentionBackend { native, cudnn };

// ATTN_OPS_ATTENTION_BACKEND: automatic (unset, "" or "auto"), or one backend forced.
enum class BackendRequest { automatic, cudnn, native };

// What the router knows of the device and the library: filled from the current device by the CUDA backend, by
// hand in tests.
struct CudnnFacts {
  bool built = false;         // this library has the cuDNN backend (cudnn-frontend headers at build time)
  int64_t version = 0;        // the loaded libcudnn, cudnnGetVersion()'s number (9.24.0: 92400), 0: none
  int sm = 0;                 // compute capability of the current device, major * 10 + minor
  bool capturing = false;     // a CUDA graph is being captured on the current stream
};

struct RouteDecision {
  AttentionBackend backend = AttentionBackend::native;
  std::string reason;  // why: the first rule that kept the call on attn_ops' kernels, or what made cuDNN eligible
};

// The backend request in ATTN_OPS_ATTENTION_BACKEND, read at every call (tests change it); another value is an
// error naming the variable and the accepted values.
BackendRequest backend_request();

// Where a forward runs (attention, attention_with_kvcache; mla_decode's absorbed calls never qualify): cuDNN when
// every rule holds, else attn_ops' kernels with the reason.
RouteDecision route_forward(const AttentionCall& call, const CudnnFacts& facts);

// Where attention_backward runs.
RouteDecision route_backward(const AttentionBackwardCall& call, const CudnnFacts& facts);

// The decision under a request: automatic returns `eligible`; native forces attn_ops' kernels; cudnn returns
// cuDNN or throws, naming the op and eligible.reason, when the call is not one cuDNN takes.
RouteDecision apply_request(const RouteDecision& eligible, BackendRequest request, const char* op);

const char* backend_name(AttentionBackend backend);

}  // namespace attn_ops::cuda
