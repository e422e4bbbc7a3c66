// cudnn_facts and the cuDNN runs: torch's cuDNN handle on the current stream, the workspace from the caching
// allocator, the tensors' pointers bound by their graph UIDs; no host synchronization.
#ifdef ATTN_OPS_WITH_CUDNN

#include "attention/cuda/cudnn_backend.h"
#include "attention/cuda/cudnn_graph.h"
#include "attention/cuda/cudnn_problem.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGuard.h>

#include <unordered_map>

namespace attn_ops::cuda {
namespace {

bool stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

// Runs `problem` with `pointers` (its operands, by SdpaUid); false with *why when there is no plan.
bool run(const SdpaProblem& problem, std::unordered_map<int64_t, void*>& pointers, const at::Tensor& like,
         std::string* why) {
  const cudnnHandle_t handle = at::native::getCudnnHandle();  // set to the current stream
  const auto plan = sdpa_plan(problem, like.get_device(), handle, stream_capturing(), why);
  if (!plan) {
    return false;
  }
  const at::Tensor workspace = at::empty({sdpa_workspace_size(*plan)}, like.options().dtype(at::kByte));
  run_sdpa(*plan, handle, pointers, workspace.data_ptr());
  return true;
}

}  // namespace

CudnnFacts cudnn_facts() {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return CudnnFacts{true, loaded_cudnn_version(), prop->major * 10 + prop->minor, stream_capturing()};
}

bool cudnn_attention_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse,
                             std::string* why) {
  const SdpaProblem problem = sdpa_forward_problem(call, out, lse);
  std::unordered_map<int64_t, void*> pointers{{kUidQ, call.q.data_ptr()}, {kUidK, call.k.data_ptr()},
                                              {kUidV, call.v.data_ptr()}, {kUidO, out.data_ptr()},
                                              {kUidStats, lse.data_ptr()}};
  // Kept alive until the run is enqueued; the caching allocator orders their reuse after it on the stream.
  at::Tensor seq_len_q, seq_len_kv, table;
  if (problem.padding_mask) {
    seq_len_q = at::full({problem.batch}, problem.seqlen_q, call.cache_seqlens->options());
    seq_len_kv = call.cache_seqlens->contiguous();
    pointers[kUidSeqLenQ] = seq_len_q.data_ptr();
    pointers[kUidSeqLenKv] = seq_len_kv.data_ptr();
  }
  if (problem.paged) {
    table = *call.block_table;
    pointers[kUidPageTableK] = table.data_ptr();
    pointers[kUidPageTableV] = table.data_ptr();
  }
  return run(problem, pointers, call.q, why);
}

bool cudnn_attention_backward(const AttentionBackwardCall& call, const at::Tensor& dq, const at::Tensor& dk,
                              const at::Tensor& dv, std::string* why) {
  const SdpaProblem problem = sdpa_backward_problem(call, dq, dk, dv);
  std::unordered_map<int64_t, void*> pointers{
      {kUidQ, call.q.data_ptr()},   {kUidK, call.k.data_ptr()},   {kUidV, call.v.data_ptr()},
      {kUidO, call.out.data_ptr()}, {kUidDout, call.dout.data_ptr()}, {kUidStats, call.lse.data_ptr()},
      {kUidDq, dq.data_ptr()},      {kUidDk, dk.data_ptr()},      {kUidDv, dv.data_ptr()}};
  return run(problem, pointers, call.q, why);
}

}  // namespace attn_ops::cuda

#endif  // ATTN_OPS_WITH_CUDNN
