// The last launch decisions of the tensor-core attention kernels, kept for the CUDA tests
// (torch.ops.attn_ops._cuda_last_launch, CUDA builds only): e.g. that MLA's 576/512 decode reads V from the K
// tile, or how many splits a decode used. Host-side only; the record costs one uncontended lock per launch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn_ops::cuda {

// Replaces the record of `kernel` ("forward_mma": dim_qk, dim_v, v_in_k, dynamic smem bytes, max splits,
// split_min_keys, rows per warp; "backward_mma": dim_qk, dim_v, query-head splits).
void record_launch(const std::string& kernel, std::vector<int64_t> values);

// Replaces the record of where the last attention `stage` ("forward", "backward") ran and why: "<backend>: <reason>"
// (torch.ops.attn_ops._cuda_last_route).
void record_route(const std::string& stage, std::string route);

}  // namespace attn_ops::cuda
