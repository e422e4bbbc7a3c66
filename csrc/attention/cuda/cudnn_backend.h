// The cuDNN side of the CUDA attention backend: the facts the router needs about this device and library, and the
// runs of the calls it sends to cuDNN (graphs from attention/cuda/cudnn_graph.h). Only in builds with the cuDNN
// backend (ATTN_OPS_WITH_CUDNN); the router keeps every call on attn_ops' kernels elsewhere.
#pragma once

#include "attention/cuda/backend_route.h"
#include "common/attention_call.h"

#include <string>

namespace attn_ops::cuda {

// The router's facts for the current device (the libcudnn torch loaded; the capture state of the current stream).
CudnnFacts cudnn_facts();

// Runs a forward the router sent to cuDNN (dense, or over a contiguous or paged cache) into out and lse. False,
// with *why, when cuDNN has no plan for it (refused, or not built before a CUDA-graph capture): the caller then
// runs attn_ops' kernels.
bool cudnn_attention_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse, std::string* why);

// Runs a dense backward the router sent to cuDNN into dq, dk and dv; false with *why as above.
bool cudnn_attention_backward(const AttentionBackwardCall& call, const at::Tensor& dq, const at::Tensor& dk,
                              const at::Tensor& dv, std::string* why);

}  // namespace attn_ops::cuda
