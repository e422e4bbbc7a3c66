// The general CUDA backward of attention, one warp per row as in forward_rows.cuh (every dtype, head dims
// up to kMaxRowDim). Deterministic and free of atomics: dQ is computed per query row over its keys, dK/dV
// per key row over the query rows of every head of its KV group that see it, recomputing the
// probabilities from the saved lse (p = exp(logit - lse)).
//
// With delta = rowsum(dout * out) - dlse, the gradient of a logit is ds = p * (dout.v - delta); the soft
// cap multiplies it by Logit::derivative.
#pragma once

#include "attention/cuda/forward_rows.cuh"

namespace attn_ops::cuda {

// delta for every (b, i, h) row. grid row_grid(max_len_q * heads_q, batch).
template <typename T>
__global__ void __launch_bounds__(kRowWarps* kWarpSize) backward_delta_kernel(const BackwardArgs<T> a) {
  using A = acc_type<T>;
  const int lane = threadIdx.x % kWarpSize;
  WarpRow r;
  if (!warp_row(a.seqs, a.heads_q, a.max_len_q, /*keys=*/false, &r)) {
    return;
  }
  const int64_t b = r.b, i = r.pos, h = r.head;
  const Seq& s = r.s;
  const T* out = a.out + a.out_layout.at(b, s.q0, i, h);
  const T* dout = a.dout + a.dout_layout.at(b, s.q0, i, h);
  A sum = A(0);
  for (int64_t d = lane; d < a.dim_v; d += kWarpSize) {
    sum += to_acc(out[d]) * to_acc(dout[d]);
  }
  sum = warp_sum(sum);
  if (lane == 0) {
    const int64_t at = a.lse_layout.at(b, s.q0, i, h);
    a.delta[at] = sum - (a.dlse != nullptr ? a.dlse[at] : A(0));
  }
}

// dot(x, y) over `dim` features, the row x held per lane (every 32nd feature), y read from memory.
template <typename T, int N>
__device__ __forceinline__ acc_type<T> row_dot(const acc_type<T> (&x)[N], const T* y, int64_t dim) {
  acc_type<T> sum = 0;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int64_t d = e * kWarpSize + lane;
    if (d < dim) {
      sum += x[e] * to_acc(y[d]);
    }
  }
  return warp_sum(sum);
}

template <typename T, int N>
__device__ __forceinline__ void load_row(acc_type<T> (&x)[N], const T* src, int64_t dim) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int64_t d = e * kWarpSize + lane;
    x[e] = d < dim ? to_acc(src[d]) : acc_type<T>(0);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_row(T* dst, const acc_type<T> (&x)[N], int64_t dim) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int64_t d = e * kWarpSize + lane;
    if (d < dim) {
      dst[d] = static_cast<T>(x[e]);
    }
  }
}

// dQ of every (b, i, h) row. grid row_grid(max_len_q * heads_q, batch).
template <typename T, int N>
__global__ void __launch_bounds__(kRowWarps* kWarpSize) backward_dq_kernel(const BackwardArgs<T> a) {
  using A = acc_type<T>;
  const int lane = threadIdx.x % kWarpSize;
  WarpRow r;
  if (!warp_row(a.seqs, a.heads_q, a.max_len_q, /*keys=*/false, &r)) {
    return;
  }
  const int64_t b = r.b, i = r.pos, h = r.head;
  const Seq& s = r.s;
  const int64_t kv_head = h / a.group, at = a.lse_layout.at(b, s.q0, i, h);
  const A lse = a.lse[at], delta = a.delta[at];
  const A slope = a.alibi.slope(b, h);
  A q[N], dout[N], dq[N];
  load_row<T, N>(q, a.q + a.q_layout.at(b, s.q0, i, h), a.dim_qk);
  load_row<T, N>(dout, a.dout + a.dout_layout.at(b, s.q0, i, h), a.dim_v);
#pragma unroll
  for (int e = 0; e < N; ++e) {
    dq[e] = A(0);
  }
  int64_t lo, hi;
  a.window.keys_of(s, i, &lo, &hi);
  if (lse == neg_inf<A>()) {
    hi = lo - 1;  // no visible key: dq = 0
  }
  for (int64_t j = lo; j <= hi; ++j) {
    const T* k = a.k + a.k_layout.at(b, s.k0, j, kv_head);
    const A x = a.logit(row_dot<T, N>(q, k, a.dim_qk));
    // ALiBi joins p only: the bias does not depend on the logit
    const A p = exp(x + (slope != A(0) ? Alibi::bias(slope, s, i, j) : A(0)) - lse);
    const A dp = row_dot<T, N>(dout, a.v + a.v_layout.at(b, s.k0, j, kv_head), a.dim_v);
    const A dx = p * (dp - delta) * a.logit.derivative(x);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int64_t d = e * kWarpSize + lane;
      dq[e] += d < a.dim_qk ? dx * to_acc(k[d]) : A(0);
    }
  }
  store_row<T, N>(a.dq + a.dq_layout.at(b, s.q0, i, h), dq, a.dim_qk);
}

// dK and dV of every (b, j, kv_head) key row, summed over the group's query heads and the queries that see
// key j. grid row_grid(max_len_k * heads_kv, batch).
template <typename T, int N>
__global__ void __launch_bounds__(kRowWarps* kWarpSize) backward_dkv_kernel(const BackwardArgs<T> a) {
  using A = acc_type<T>;
  const int lane = threadIdx.x % kWarpSize;
  WarpRow r;
  if (!warp_row(a.seqs, a.heads_kv, a.max_len_k, /*keys=*/true, &r)) {
    return;
  }
  const int64_t b = r.b, j = r.pos, kv_head = r.head;
  const Seq& s = r.s;
  A k[N], v[N], dk[N], dv[N];
  load_row<T, N>(k, a.k + a.k_layout.at(b, s.k0, j, kv_head), a.dim_qk);
  load_row<T, N>(v, a.v + a.v_layout.at(b, s.k0, j, kv_head), a.dim_v);
#pragma unroll
  for (int e = 0; e < N; ++e) {
    dk[e] = A(0);
    dv[e] = A(0);
  }
  int64_t first, last;
  a.window.queries_of(s, j, &first, &last);
  for (int64_t h = kv_head * a.group; h < (kv_head + 1) * a.group; ++h) {
    const A slope = a.alibi.slope(b, h);
    for (int64_t i = first; i <= last; ++i) {
      const int64_t at = a.lse_layout.at(b, s.q0, i, h);
      const T* q = a.q + a.q_layout.at(b, s.q0, i, h);
      const T* dout = a.dout + a.dout_layout.at(b, s.q0, i, h);
      const A x = a.logit(row_dot<T, N>(k, q, a.dim_qk));
      const A p = exp(x + (slope != A(0) ? Alibi::bias(slope, s, i, j) : A(0)) - a.lse[at]);
      const A dx = p * (row_dot<T, N>(v, dout, a.dim_v) - a.delta[at]) * a.logit.derivative(x);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const int64_t d = e * kWarpSize + lane;
        dv[e] += d < a.dim_v ? p * to_acc(dout[d]) : A(0);
        dk[e] += d < a.dim_qk ? dx * to_acc(q[d]) : A(0);
      }
    }
  }
  store_row<T, N>(a.dk + a.dk_layout.at(b, s.k0, j, kv_head), dk, a.dim_qk);
  store_row<T, N>(a.dv + a.dv_layout.at(b, s.k0, j, kv_head), dv, a.dim_v);
}

}  // namespace attn_ops::cuda
