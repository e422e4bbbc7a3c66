// cuDNN fused-attention graphs of SdpaProblems (attention/cuda/cudnn_problem.h), through the cudnn-frontend C++
// API, which only cudnn_graph.cpp includes: a problem's validation for a compute capability, which needs no GPU
// (the test hook _cudnn_validate_attention); the CUDA backend builds and runs the same graphs. Only in builds that
// found the cudnn-frontend headers (ATTN_OPS_WITH_CUDNN).
#pragma once

#include "attention/cuda/cudnn_problem.h"

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

namespace attn_ops::cuda {

// The tensor UIDs of every graph: the variant pack binds the data pointers by them.
enum SdpaUid : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidDout,
  kUidDq,
  kUidDk,
  kUidDv,
  kUidSeqLenQ,   // int32 [B, 1, 1, 1]: each row's query count (over a cache)
  kUidSeqLenKv,  // int32 [B, 1, 1, 1]: each row's key count (cache_seqlens)
  kUidPageTableK,
  kUidPageTableV,
};

// Whether cuDNN (the libcudnn loaded in this process) takes the problem's graph on a device of compute
// capability sm (major * 10 + minor): "" when validate() succeeds, else its message. Loads libcudnn when needed.
std::string validate_sdpa(const SdpaProblem& problem, int sm);

// The loaded libcudnn's version (cudnnGetVersion()), or 0 when none can be loaded.
int64_t loaded_cudnn_version();

// A problem's graph with its execution plan, built for one device; opaque outside cudnn_graph.cpp, and hidden
// like the frontend types it holds.
struct __attribute__((visibility("hidden"))) SdpaPlan;

// The plan of `problem` on device `device`: from a bounded LRU cache keyed on the device and the whole problem,
// else built now with `handle` (validate, operation graph, heuristics A, plans) and cached. nullptr, with *why,
// when cuDNN refuses the problem (remembered as refused: not retried) or, while `capturing` a CUDA graph, when
// the plan is not cached (no graph is built during capture).
std::shared_ptr<const SdpaPlan> sdpa_plan(const SdpaProblem& problem, int device, cudnnHandle_t handle,
                                          bool capturing, std::string* why);

// The workspace bytes the plan needs.
int64_t sdpa_workspace_size(const SdpaPlan& plan);

// Runs the plan on the handle's stream with the data pointers of its tensors (SdpaUid -> pointer) and a
// workspace of sdpa_workspace_size bytes. Throws c10::Error with cuDNN's message on failure.
void run_sdpa(const SdpaPlan& plan, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pointers,
              void* workspace);

}  // namespace attn_ops::cuda
