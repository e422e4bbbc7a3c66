// CUDA kernels of additive_attention and its backward: one warp per query row, keys streamed one at a
// time with an online softmax (the score of a pair is a warp reduction over the hidden dimension), so
// nothing of size [Tq, Tk, hidden] exists. Inputs are converted to the accumulation dtype (float32,
// float64 for float64) first, as on CPU. The backward recomputes tanh per pair; dkp and dv are
// accumulated with atomics, dqp and per-row dw partials by the warp that owns the row.
#include "additive/validation.h"

#include "common/cuda/device_utils.cuh"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace attn_ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

template <typename A>
struct AdditiveArgs {
  const A* qp;        // [batch, query_len, hidden]
  const A* kp;        // [batch, key_len, hidden]
  const A* w;         // [hidden]
  const A* v;         // [batch, key_len, value_dim]
  const bool* mask;   // [batch, key_len], true = padded; nullptr when absent
  int64_t rows, query_len, key_len, hidden, value_dim;
};

// w . tanh(q + k), summed over the warp; every lane gets the result.
template <typename A>
__device__ __forceinline__ A pair_score(const A* q, const A* k, const A* w, int64_t hidden, int lane) {
  A part = 0;
  for (int64_t i = lane; i < hidden; i += kWarpSize) {
    part += w[i] * tanh(q[i] + k[i]);
  }
  return warp_sum(part);
}

// max that lets NaN through, so a NaN score reaches the row's output.
template <typename A>
__device__ __forceinline__ A nan_max(A m, A s) {
  return s <= m ? m : s;
}

template <typename A>
__global__ void additive_forward_kernel(const AdditiveArgs<A> a,
                                        A* out,       // [batch, query_len, value_dim]
                                        A* lse,       // [batch, query_len]
                                        A* weights) { // [batch, query_len, key_len] or nullptr
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  if (r >= a.rows) {
    return;
  }
  const int64_t b = r / a.query_len, Dv = a.value_dim;
  const A* q = a.qp + r * a.hidden;
  A* o = out + r * Dv;
  A* row_weights = weights ? weights + r * a.key_len : nullptr;
  for (int64_t d = lane; d < Dv; d += kWarpSize) {
    o[d] = 0;
  }
  A m = neg_inf<A>(), l = 0;
  for (int64_t j = 0; j < a.key_len; ++j) {
    const int64_t key = b * a.key_len + j;
    const bool padded = a.mask && a.mask[key];
    const A s = padded ? neg_inf<A>() : pair_score(q, a.kp + key * a.hidden, a.w, a.hidden, lane);
    if (row_weights && lane == 0) {
      row_weights[j] = s;  // raw score, normalized below
    }
    const A m_new = nan_max(m, s);
    if (padded || m_new == neg_inf<A>()) {
      continue;
    }
    const A rescale = exp(m - m_new), p = exp(s - m_new);
    l = l * rescale + p;
    const A* vj = a.v + key * Dv;
    for (int64_t d = lane; d < Dv; d += kWarpSize) {
      o[d] = o[d] * rescale + p * vj[d];
    }
    m = m_new;
  }
  // A row with no visible key keeps o = 0 and gets lse = -inf.
  const A row_lse = l == A(0) ? neg_inf<A>() : m + log(l);
  if (l != A(0)) {
    for (int64_t d = lane; d < Dv; d += kWarpSize) {
      o[d] /= l;
    }
  }
  if (lane == 0) {
    lse[r] = row_lse;
  }
  if (row_weights) {
    __syncwarp();
    for (int64_t j = lane; j < a.key_len; j += kWarpSize) {
      row_weights[j] = row_lse == neg_inf<A>() ? A(0) : exp(row_weights[j] - row_lse);
    }
  }
}

template <typename A>
__global__ void additive_backward_kernel(const AdditiveArgs<A> a,
                                         const A* dout,  // [batch, query_len, value_dim]
                                         const A* out,   // [batch, query_len, value_dim]
                                         const A* lse,   // [batch, query_len]
                                         const A* dlse,  // [batch, query_len] or nullptr
                                         A* dqp,         // [batch, query_len, hidden]
                                         A* dkp,         // [batch, key_len, hidden], zeros, atomics
                                         A* dv,          // [batch, key_len, value_dim], zeros, atomics
                                         A* dw_rows) {   // [batch, query_len, hidden]: this row's part of dw
  const int lane = threadIdx.x % kWarpSize;
  const int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  if (r >= a.rows) {
    return;
  }
  const int64_t b = r / a.query_len, Dv = a.value_dim, H = a.hidden;
  const A* q = a.qp + r * H;
  const A* g_out = dout + r * Dv;
  A* dq = dqp + r * H;
  A* dw = dw_rows + r * H;
  for (int64_t i = lane; i < H; i += kWarpSize) {
    dq[i] = 0;
    dw[i] = 0;
  }
  if (lse[r] == neg_inf<A>()) {
    return;  // no visible key: the row's output is a constant zero
  }
  A part = 0;
  for (int64_t d = lane; d < Dv; d += kWarpSize) {
    part += g_out[d] * out[r * Dv + d];
  }
  const A shift = (dlse ? dlse[r] : A(0)) - warp_sum(part);
  for (int64_t j = 0; j < a.key_len; ++j) {
    const int64_t key = b * a.key_len + j;
    if (a.mask && a.mask[key]) {
      continue;
    }
    const A* k = a.kp + key * H;
    const A p = exp(pair_score(q, k, a.w, H, lane) - lse[r]);
    const A* vj = a.v + key * Dv;
    A dp = 0;
    for (int64_t d = lane; d < Dv; d += kWarpSize) {
      dp += g_out[d] * vj[d];
      atomicAdd(dv + key * Dv + d, p * g_out[d]);
    }
    const A ds = p * (warp_sum(dp) + shift);
    for (int64_t i = lane; i < H; i += kWarpSize) {
      const A t = tanh(q[i] + k[i]);
      const A g = ds * a.w[i] * (A(1) - t * t);
      dq[i] += g;
      atomicAdd(dkp + key * H + i, g);
      dw[i] += ds * t;
    }
  }
}

int64_t blocks_for(int64_t rows) { return ceil_div(rows, kWarpsPerBlock); }

template <typename A>
AdditiveArgs<A> make_args(const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w, const at::Tensor& v,
                          const at::Tensor& mask) {
  return {qp.const_data_ptr<A>(), kp.const_data_ptr<A>(),  w.const_data_ptr<A>(),
          v.const_data_ptr<A>(),  mask.defined() ? mask.const_data_ptr<bool>() : nullptr,
          qp.size(0) * qp.size(1), qp.size(1), kp.size(1), qp.size(2), v.size(2)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> additive_attention_cuda(
    const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w, const at::Tensor& v,
    const std::optional<at::Tensor>& key_padding_mask, bool return_weights) {
  prepare_additive_attention(qp, kp, w, v, key_padding_mask);
  const c10::cuda::CUDAGuard guard(qp.device());
  const c10::ScalarType acc = additive_lse_dtype(qp);
  const auto prep = [&](const at::Tensor& x) { return x.to(acc).contiguous(); };
  const at::Tensor q = prep(qp), k = prep(kp), wc = prep(w), vc = prep(v);
  const at::Tensor mask = key_padding_mask.has_value() ? key_padding_mask->contiguous() : at::Tensor();
  const int64_t B = qp.size(0), Tq = qp.size(1), Tk = kp.size(1), Dv = v.size(2);
  at::Tensor out = at::empty({B, Tq, Dv}, q.options());
  at::Tensor lse = at::empty({B, Tq}, q.options());
  at::Tensor weights = at::empty(return_weights ? at::IntArrayRef{B, Tq, Tk} : at::IntArrayRef{0}, q.options());
  if (B * Tq > 0) {
    AT_DISPATCH_FLOATING_TYPES(acc, "attn_ops.additive_attention", [&] {
      additive_forward_kernel<scalar_t>
          <<<blocks_for(B * Tq), kWarpsPerBlock * kWarpSize, 0, at::cuda::getCurrentCUDAStream()>>>(
              make_args<scalar_t>(q, k, wc, vc, mask), out.mutable_data_ptr<scalar_t>(),
              lse.mutable_data_ptr<scalar_t>(), return_weights ? weights.mutable_data_ptr<scalar_t>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return {out.to(qp.scalar_type()), lse, weights.to(qp.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> additive_attention_backward_cuda(
    const at::Tensor& dout, const std::optional<at::Tensor>& dlse, const at::Tensor& qp, const at::Tensor& kp,
    const at::Tensor& w, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& key_padding_mask) {
  prepare_additive_attention_backward(dout, dlse, qp, kp, w, v, out, lse, key_padding_mask);
  const c10::cuda::CUDAGuard guard(qp.device());
  const c10::ScalarType acc = additive_lse_dtype(qp);
  const auto prep = [&](const at::Tensor& x) { return x.to(acc).contiguous(); };
  const at::Tensor q = prep(qp), k = prep(kp), wc = prep(w), vc = prep(v), g = prep(dout), o = prep(out),
                   l = prep(lse), dl = dlse.has_value() ? prep(*dlse) : at::Tensor();
  const at::Tensor mask = key_padding_mask.has_value() ? key_padding_mask->contiguous() : at::Tensor();
  at::Tensor dqp = at::empty(q.sizes(), q.options()), dw_rows = at::empty(q.sizes(), q.options());
  at::Tensor dkp = at::zeros(k.sizes(), k.options()), dv = at::zeros(vc.sizes(), vc.options());
  const int64_t rows = qp.size(0) * qp.size(1);
  if (rows > 0) {
    AT_DISPATCH_FLOATING_TYPES(acc, "attn_ops.additive_attention_backward", [&] {
      additive_backward_kernel<scalar_t>
          <<<blocks_for(rows), kWarpsPerBlock * kWarpSize, 0, at::cuda::getCurrentCUDAStream()>>>(
              make_args<scalar_t>(q, k, wc, vc, mask), g.const_data_ptr<scalar_t>(), o.const_data_ptr<scalar_t>(),
              l.const_data_ptr<scalar_t>(), dl.defined() ? dl.const_data_ptr<scalar_t>() : nullptr,
              dqp.mutable_data_ptr<scalar_t>(), dkp.mutable_data_ptr<scalar_t>(), dv.mutable_data_ptr<scalar_t>(),
              dw_rows.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  const c10::ScalarType dtype = qp.scalar_type();
  return {dqp.to(dtype), dkp.to(dtype), dw_rows.sum(at::IntArrayRef{0, 1}).to(dtype), dv.to(dtype)};
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("additive_attention", &additive_attention_cuda);
  m.impl("additive_attention_backward", &additive_attention_backward_cuda);
}

}  // namespace attn_ops::cuda
