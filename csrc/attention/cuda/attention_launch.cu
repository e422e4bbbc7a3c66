// Launchers of the CUDA attention kernels: the row kernels' features-per-lane bucket, the choice between
// the tensor-core and the row kernels (forward and backward), and the split-KV merge.
#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/backward_rows.cuh"

#include <c10/util/Exception.h>

namespace attn_ops::cuda {
namespace {

// Calls f(std::integral_constant<int, N>) with N = features per lane covering `dim` (<= kMaxRowDim).
template <typename F>
void with_lane_features(int64_t dim, F&& f) {
  if (dim <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (dim <= 128) {
    f(std::integral_constant<int, 4>{});
  } else if (dim <= 256) {
    f(std::integral_constant<int, 8>{});
  } else if (dim <= 576) {
    f(std::integral_constant<int, 18>{});
  } else {
    TORCH_INTERNAL_ASSERT(dim <= kMaxRowDim, "head dim ", dim, " passed validation but exceeds ", kMaxRowDim);
    f(std::integral_constant<int, 32>{});
  }
}

template <typename T>
void launch_forward_rows(const ForwardArgs<T>& a, cudaStream_t stream) {
  with_lane_features(std::max(a.dim_qk, a.dim_v), [&](auto n) {
    forward_rows_kernel<T, decltype(n)::value>
        <<<row_grid(a.max_len_q * a.heads_q, a.batch, a.splits), kRowWarps * kWarpSize, 0, stream>>>(a);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Runs the tensor-core forward when it covers the case (16-bit dtypes, its head dims, aligned rows).
template <typename T>
bool try_forward_mma(const ForwardArgs<T>& a) {
  if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
    if (mma_forward_supported(c10::CppTypeToScalarType<T>::value, a.dim_qk, a.dim_v) && mma_forward_aligned(a)) {
      launch_forward_mma(a);
      return true;
    }
  }
  return false;
}

// Runs the tensor-core backward when it covers the case (backward_uses_mma).
template <typename T>
bool try_backward_mma(const BackwardArgs<T>& a) {
  if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
    if (backward_uses_mma(a)) {
      launch_backward_mma(a);
      return true;
    }
  }
  return false;
}

}  // namespace

template <typename T>
bool backward_uses_mma(const BackwardArgs<T>& a) {
  if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
    // ALiBi runs on the row kernels: its bias in the tensor-core backward would cost every call registers.
    // Deterministic too: the tensor-core backward sums dQ (and split dK / dV) with atomics.
    return a.alibi.slopes == nullptr && !a.deterministic &&
           mma_backward_supported(c10::CppTypeToScalarType<T>::value, a.dim_qk, a.dim_v) && mma_backward_aligned(a);
  } else {
    return false;
  }
}

template <typename T>
void launch_attention_forward(const ForwardArgs<T>& a) {
  if (a.batch == 0 || a.max_len_q == 0 || a.heads_q == 0) {
    return;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (!try_forward_mma(a)) {
    launch_forward_rows(a, stream);
  }
  if (a.splits > 1) {
    merge_splits_kernel<T><<<row_grid(a.max_len_q * a.heads_q, a.batch), kRowWarps * kWarpSize, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <typename T>
void launch_attention_backward(const BackwardArgs<T>& a) {
  if (a.batch == 0 || a.heads_q == 0) {
    return;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const dim3 block(kRowWarps * kWarpSize);
  if (a.max_len_q > 0) {
    backward_delta_kernel<T><<<row_grid(a.max_len_q * a.heads_q, a.batch), block, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (try_backward_mma(a)) {
    return;
  }
  with_lane_features(std::max(a.dim_qk, a.dim_v), [&](auto n) {
    constexpr int N = decltype(n)::value;
    if (a.max_len_q > 0) {
      backward_dq_kernel<T, N><<<row_grid(a.max_len_q * a.heads_q, a.batch), block, 0, stream>>>(a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (a.max_len_k > 0) {
      backward_dkv_kernel<T, N><<<row_grid(a.max_len_k * a.heads_kv, a.batch), block, 0, stream>>>(a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

#define ATTN_OPS_INSTANTIATE(T)                                          \
  template void launch_attention_forward<T>(const ForwardArgs<T>& a); \
  template void launch_attention_backward<T>(const BackwardArgs<T>& a); \
  template bool backward_uses_mma<T>(const BackwardArgs<T>& a);
ATTN_OPS_INSTANTIATE(float)
ATTN_OPS_INSTANTIATE(double)
ATTN_OPS_INSTANTIATE(c10::Half)
ATTN_OPS_INSTANTIATE(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE

}  // namespace attn_ops::cuda
