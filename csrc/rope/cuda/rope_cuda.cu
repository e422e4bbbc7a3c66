// CUDA kernels of the rotary embedding: one thread per rotated pair (both features read before either is
// written, so the in-place op is race-free) and, out of place, one per feature past rotary_dim. Rotations
// in float32 (float64 for float64), as on CPU.
#include "rope/validation.h"

#include "common/cuda/device_utils.cuh"
#include "common/cuda/index_checks.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace attn_ops::cuda {
namespace {

// Element offset of token t, t indexing the flattened leading dims of a tensor (any strides).
struct TokenIndexer {
  int ndim = 0;
  int64_t sizes[kRotaryMaxDims - 2] = {};
  int64_t strides[kRotaryMaxDims - 2] = {};

  __device__ __forceinline__ int64_t at(int64_t t) const {
    int64_t offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      offset += (t % sizes[d]) * strides[d];
      t /= sizes[d];
    }
    return offset;
  }
};

TokenIndexer token_indexer(const at::Tensor& x) {
  TokenIndexer ix;
  ix.ndim = static_cast<int>(x.dim() - 2);
  for (int d = 0; d < ix.ndim; ++d) {
    ix.sizes[d] = x.size(d);
    ix.strides[d] = x.stride(d);
  }
  return ix;
}

template <typename T, typename C, typename P>
struct RopeArgs {
  const T* src;       // [..., heads, dim]
  T* dst;             // [..., heads, dim] (src itself in place)
  const C* cos;       // [max_positions, half] contiguous
  const C* sin;       // [max_positions, half] contiguous
  const P* positions; // [tokens] contiguous
  TokenIndexer src_tokens, dst_tokens;
  int64_t src_head, dst_head, tokens, heads, dim, half, max_positions;
  bool interleaved, inverse, copy_rest;
};

// grid-stride over (token, head, j): j < half rotates pair j, j >= half copies feature 2 * half + (j - half).
template <typename T, typename C, typename P>
__global__ void rope_kernel(const RopeArgs<T, C, P> a) {
  using A = acc_type<T>;
  const int64_t per_row = a.half + (a.copy_rest ? a.dim - 2 * a.half : 0);
  const int64_t total = a.tokens * a.heads * per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx % per_row, row = idx / per_row;
    const int64_t t = row / a.heads, h = row % a.heads;
    const T* x = a.src + a.src_tokens.at(t) + h * a.src_head;
    T* y = a.dst + a.dst_tokens.at(t) + h * a.dst_head;
    if (j >= a.half) {  // out of place: a feature past rotary_dim passes through
      y[j + a.half] = x[j + a.half];
      continue;
    }
    const int64_t ia = a.interleaved ? 2 * j : j, ib = a.interleaved ? 2 * j + 1 : j + a.half;
    const int64_t pos = static_cast<int64_t>(a.positions[t]);
    if (pos < 0 || pos >= a.max_positions) {  // unchecked (CUDA-graph capture): the pair passes through
      if (a.copy_rest) {
        y[ia] = x[ia];
        y[ib] = x[ib];
      }
      continue;
    }
    const A c = static_cast<A>(a.cos[pos * a.half + j]);
    const A s = (a.inverse ? A(-1) : A(1)) * static_cast<A>(a.sin[pos * a.half + j]);
    const A xa = static_cast<A>(x[ia]), xb = static_cast<A>(x[ib]);
    y[ia] = static_cast<T>(xa * c - xb * s);
    y[ib] = static_cast<T>(xb * c + xa * s);
  }
}

// dst = the rotation of src (validated for `op`), after the device-side check of the positions.
void rotate(const char* op, const at::Tensor& src, const at::Tensor& dst, const at::Tensor& cos, const at::Tensor& sin,
            const at::Tensor& positions, bool interleaved, bool inverse) {
  const c10::cuda::CUDAGuard guard(src.device());
  check_positions_on_device(op, positions, cos.size(0));
  const at::Tensor cos_c = cos.contiguous(), sin_c = sin.contiguous(), pos = positions.contiguous();
  const int64_t heads = src.size(-2), dim = src.size(-1), half = cos.size(1);
  const int64_t tokens = pos.numel();
  const bool copy_rest = src.data_ptr() != dst.data_ptr();
  const int64_t total = tokens * heads * (half + (copy_rest ? dim - 2 * half : 0));
  if (total == 0) {
    return;
  }
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div(total, threads), 8 * int64_t(sm_count()));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "attn_ops.rotary_embedding", [&] {
    auto run = [&](const auto* table) {
      using C = pointee_t<decltype(table)>;
      with_index_data(pos, [&](const auto* index) {
        using P = pointee_t<decltype(index)>;
        const RopeArgs<scalar_t, C, P> a{src.const_data_ptr<scalar_t>(), dst.mutable_data_ptr<scalar_t>(),
                                         table, sin_c.const_data_ptr<C>(), index, token_indexer(src),
                                         token_indexer(dst), src.stride(-2), dst.stride(-2), tokens, heads, dim, half,
                                         cos.size(0), interleaved, inverse, copy_rest};
        rope_kernel<scalar_t, C, P><<<blocks, threads, 0, stream>>>(a);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    };
    if (cos_c.scalar_type() == src.scalar_type()) {
      run(cos_c.const_data_ptr<scalar_t>());
    } else {
      run(cos_c.const_data_ptr<float>());
    }
  });
}

at::Tensor rotary_embedding_cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& positions, bool interleaved, bool inverse) {
  check_rotary_inputs("attn_ops.rotary_embedding", x, cos, sin, positions);
  at::Tensor out = at::empty(x.sizes(), x.options());
  rotate("attn_ops.rotary_embedding", x, out, cos, sin, positions, interleaved, inverse);
  return out;
}

void rotary_embedding__cuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, bool interleaved, bool inverse) {
  check_rotary_inplace_inputs(x, cos, sin, positions);
  rotate("attn_ops.rotary_embedding_", x, x, cos, sin, positions, interleaved, inverse);
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("rotary_embedding", &rotary_embedding_cuda);
  m.impl("rotary_embedding_", &rotary_embedding__cuda);
}

}  // namespace attn_ops::cuda
