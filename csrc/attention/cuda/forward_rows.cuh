// The general CUDA forward of attention: one warp per (query position, query head) row, online softmax
// over its visible keys, each lane holding every 32nd feature. It serves every dtype (float32 / float64
// included), every head dim up to kMaxRowDim, and every layout (dense, varlen, paged cache), and is the
// reference path that the tensor-core kernel (forward_mma.cu) must match; it re-reads K/V per query row,
// so it is slow for long prefill.
#pragma once

#include "attention/cuda/problem.cuh"
#include "attention/validation.h"

namespace attn_ops::cuda {

constexpr int kRowWarps = 4;          // rows (warps) per block
constexpr int64_t kMaxRowDim = kMaxHeadDim;  // 32 features per lane

// The row of this warp in a row-kernel grid (row_grid: x = sequence * row_blocks + kRowWarps rows of
// position * heads + head, z: split). The sequence is folded into x, whose limit is 2^31 - 1, not into y,
// whose limit of 65535 a batch or a varlen call can exceed. False when the position is past the sequence's
// length or the grid bound `max_len`.
struct WarpRow {
  int64_t b, pos, head;
  Seq s;
};

__device__ __forceinline__ bool warp_row(const SeqInfo& seqs, int64_t heads, int64_t max_len, bool keys, WarpRow* r) {
  const int64_t row_blocks = ceil_div(max_len * heads, kRowWarps);
  const int64_t row = blockIdx.x % row_blocks * int64_t(kRowWarps) + threadIdx.x / kWarpSize;
  r->b = blockIdx.x / row_blocks;
  r->s = seqs.at(r->b);
  r->pos = row / heads;
  r->head = row % heads;
  return r->pos < (keys ? r->s.len_k : r->s.len_q) && r->pos < max_len;
}

// The grid of a row kernel over `rows_per_seq` = max_len * heads rows of `batch` sequences (warp_row).
inline dim3 row_grid(int64_t rows_per_seq, int64_t batch, int64_t splits = 1) {
  const int64_t blocks = ceil_div(rows_per_seq, kRowWarps) * batch;
  TORCH_CHECK(blocks <= INT32_MAX && splits <= 65535, "attn_ops: attention too large for one launch (", blocks,
              " row blocks, ", splits, " splits)");
  return dim3(static_cast<unsigned>(blocks), 1, static_cast<unsigned>(splits));
}

// Where split `split` of row (b, i, h) keeps its partial result.
template <typename T>
__device__ __forceinline__ int64_t partial_index(const ForwardArgs<T>& a, int64_t split, int64_t b, int64_t i,
                                                 int64_t h) {
  return ((split * a.batch + b) * a.max_len_q + i) * a.heads_q + h;
}

// Stores a row's result: o (unnormalised, per lane) / l and lse = m + log(l); out = 0, lse = -inf for a
// row that saw no key. With splits, into the partial buffers for merge_splits_kernel.
template <typename T, int N>
__device__ __forceinline__ void store_forward_row(const ForwardArgs<T>& a, const Seq& s, int64_t b, int64_t i, int64_t h,
                                          int64_t split, const acc_type<T> (&o)[N], acc_type<T> m, acc_type<T> l) {
  using A = acc_type<T>;
  const int lane = threadIdx.x % kWarpSize;
  // l == 0: no visible key (zeros, -inf); a NaN l (NaN in a score) stays NaN in both.
  const A inv = l != A(0) ? A(1) / l : A(0);
  const A lse = l != A(0) ? m + log(l) : neg_inf<A>();
  if (a.splits == 1) {
    T* out = a.out + a.out_layout.at(b, s.q0, i, h);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int64_t d = e * kWarpSize + lane;
      if (d < a.dim_v) {
        out[d] = static_cast<T>(o[e] * inv);
      }
    }
    if (lane == 0) {
      a.lse[a.lse_layout.at(b, s.q0, i, h)] = lse;
    }
    return;
  }
  const int64_t idx = partial_index(a, split, b, i, h);
  A* out = a.partial_out + idx * a.dim_v;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int64_t d = e * kWarpSize + lane;
    if (d < a.dim_v) {
      out[d] = o[e] * inv;
    }
  }
  if (lane == 0) {
    a.partial_lse[idx] = lse;
  }
}

// grid row_grid(max_len_q * heads_q, batch, splits), block kRowWarps * 32. N = features per lane.
template <typename T, int N>
__global__ void __launch_bounds__(kRowWarps* kWarpSize) forward_rows_kernel(const ForwardArgs<T> a) {
  using A = acc_type<T>;
  const int lane = threadIdx.x % kWarpSize;
  WarpRow r;
  if (!warp_row(a.seqs, a.heads_q, a.max_len_q, /*keys=*/false, &r)) {
    return;
  }
  const int64_t b = r.b, i = r.pos, h = r.head, split = blockIdx.z;
  const Seq& s = r.s;
  int64_t lo, hi;
  a.window.keys_of(s, i, &lo, &hi);
  if (a.splits > 1) {
    if (split >= a.splits_used(s.len_k)) {
      return;  // past the row's keys: merge_splits_kernel reads only the used splits
    }
    const int64_t chunk = a.keys_per_split(s.len_k);
    lo = max(lo, split * chunk);
    hi = min(hi, (split + 1) * chunk - 1);
  }
  const int64_t kv_head = h / a.group;
  const A slope = a.alibi.slope(b, h);
  const T* q = a.q + a.q_layout.at(b, s.q0, i, h);
  A qv[N], o[N];
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int64_t d = e * kWarpSize + lane;
    qv[e] = d < a.dim_qk ? to_acc(q[d]) : A(0);
    o[e] = A(0);
  }
  A m = neg_inf<A>(), l = A(0);
  for (int64_t j = lo; j <= hi; ++j) {
    const int64_t k_off = a.k_layout.at(b, s.k0, j, kv_head);
    const int64_t v_off = a.v_layout.at(b, s.k0, j, kv_head);
    if (k_off < 0 || v_off < 0) {
      continue;  // unchecked block-table entry out of range (the same for the whole warp)
    }
    const T* k = a.k + k_off;
    A dot = A(0);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int64_t d = e * kWarpSize + lane;
      if (d < a.dim_qk) {
        dot += qv[e] * to_acc(k[d]);
      }
    }
    const A x = a.logit(warp_sum(dot)) + (slope != A(0) ? Alibi::bias(slope, s, i, j) : A(0));
    const A m_new = nan_max(m, x);
    // -inf scores so far weigh 0, as masked keys (exp(-inf - -inf) would be NaN)
    const A correction = m_new == neg_inf<A>() ? A(1) : exp(m - m_new);
    const A p = m_new == neg_inf<A>() ? A(0) : exp(x - m_new);
    l = l * correction + p;
    const T* v = a.v + v_off;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int64_t d = e * kWarpSize + lane;
      o[e] = o[e] * correction + (d < a.dim_v ? p * to_acc(v[d]) : A(0));
    }
    m = m_new;
  }
  store_forward_row<T, N>(a, s, b, i, h, split, o, m, l);
}

// Merges the used splits of every row by their lse: out = sum_s w_s o_s / sum_s w_s with w_s = exp(lse_s - max),
// lse = max + log(sum_s w_s). grid row_grid(max_len_q * heads_q, batch), block kRowWarps * 32.
template <typename T>
__global__ void __launch_bounds__(kRowWarps* kWarpSize) merge_splits_kernel(const ForwardArgs<T> a) {
  using A = acc_type<T>;
  const int lane = threadIdx.x % kWarpSize;
  WarpRow r;
  if (!warp_row(a.seqs, a.heads_q, a.max_len_q, /*keys=*/false, &r)) {
    return;
  }
  const int64_t b = r.b, i = r.pos, h = r.head;
  const Seq& s = r.s;
  const int64_t splits = a.splits_used(s.len_k);
  A top = neg_inf<A>();
  for (int64_t sp = 0; sp < splits; ++sp) {
    top = nan_max(top, a.partial_lse[partial_index(a, sp, b, i, h)]);
  }
  A total = A(0);
  if (top != neg_inf<A>()) {
    for (int64_t sp = 0; sp < splits; ++sp) {
      total += exp(a.partial_lse[partial_index(a, sp, b, i, h)] - top);
    }
  }
  T* out = a.out + a.out_layout.at(b, s.q0, i, h);
  for (int64_t d = lane; d < a.dim_v; d += kWarpSize) {
    A sum = A(0);
    if (total != A(0)) {  // NaN partials give a NaN row
      for (int64_t sp = 0; sp < splits; ++sp) {
        const int64_t idx = partial_index(a, sp, b, i, h);
        const A w = exp(a.partial_lse[idx] - top);  // 0 for an empty split (lse -inf)
        sum += w * a.partial_out[idx * a.dim_v + d];
      }
      sum /= total;
    }
    out[d] = static_cast<T>(sum);
  }
  if (lane == 0) {
    a.lse[a.lse_layout.at(b, s.q0, i, h)] = total != A(0) ? top + log(total) : neg_inf<A>();
  }
}

}  // namespace attn_ops::cuda
