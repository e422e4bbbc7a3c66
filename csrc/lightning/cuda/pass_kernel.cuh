// The lightning recurrence on CUDA, one thread block per (sequence, query head, tile of value columns):
//   S_t = a * S_{t-1} + kv_scale * kk_t^T vv_t,   o_t = out_scale * qq_t S_t,   a = exp(-slope[h]),
// block-wise as on the CPU (intra-block left product with the causal decay mask, inter-block right product
// with the state, which lives in shared memory for the whole sequence). The forward op, the three backward
// passes and the decode op (state read from and written back to the pool) all launch this one kernel.
// SIMT float32 FMA loops (float64 for float64); compiled for sm_90, not yet run on a GPU.
#pragma once

#include "common/cuda/device_utils.cuh"

#include <cstdint>

namespace attn_ops::cuda {

constexpr int kLightningThreads = 256;
constexpr int kLightningTokens = 32;  // tokens per block of the chunked algorithm
constexpr int kLightningCols = 64;    // value columns per thread block

// Token rows of an operand: element (b, token, head, 0) at base + b * batch + token * token_stride + head * head.
template <typename T>
struct DevRows {
  T* base = nullptr;
  int64_t batch = 0, token = 0, head = 0;
  bool per_kv_head = false;
};

// A state tensor [slots, H, rows, cols] through any strides (a transposed view included).
template <typename A>
struct DevState {
  A* base = nullptr;  // nullptr: zeros in / nothing out
  int64_t slot = 0, head = 0, row = 0, col = 0;
};

template <typename in_t, typename out_t, typename A>
struct PassArgs {
  DevRows<const in_t> qq, kk, vv;
  DevRows<out_t> out;
  int64_t batch = 0, heads = 0, group = 1, dk = 0, dv = 0;
  int64_t seqlen = 0;                 // dense: the length; packed: the total tokens (cu_seqlens is clamped to it)
  const int32_t* cu_seqlens = nullptr;  // [batch + 1], contiguous
  const int32_t* slots = nullptr;     // -1 skips a row; nullptr: slot b
  int64_t num_slots = 0;              // slots outside [0, num_slots) are skipped (never read out of range)
  DevState<A> init, fin;
  const float* slope = nullptr;
  A out_scale = 1, kv_scale = 1;
  bool reverse = false, decay_initial = true;
};

template <typename in_t, typename out_t, typename A>
__global__ void __launch_bounds__(kLightningThreads) lightning_pass_kernel(PassArgs<in_t, out_t, A> a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t tiles = (a.dv + kLightningCols - 1) / kLightningCols;
  const int64_t item = blockIdx.x;
  const int64_t b = item / (a.heads * tiles), h = (item / tiles) % a.heads, col0 = (item % tiles) * kLightningCols;
  const int nv = static_cast<int>(a.dv - col0 < kLightningCols ? a.dv - col0 : kLightningCols);
  const int dk = static_cast<int>(a.dk);
  const int64_t g = h / a.group;
  // Offsets clamped into the packed rows: the value checks run before eager launches but not under CUDA-graph
  // capture (docs/cuda.md), and a bad offset must not reach memory outside q / k / v / out.
  const int64_t start = a.cu_seqlens ? min(max(int64_t(a.cu_seqlens[b]), int64_t(0)), a.seqlen) : 0;
  const int64_t T = a.cu_seqlens ? min(max(int64_t(a.cu_seqlens[b + 1]), start), a.seqlen) - start : a.seqlen;
  auto row = [&](const auto& rows, int64_t t) {  // stream position t -> its token row (reversed if asked)
    const int64_t r = a.reverse ? T - 1 - t : t;
    return rows.base + b * rows.batch + (start + r) * rows.token + (rows.per_kv_head ? g : h) * rows.head;
  };
  int64_t slot = a.slots ? a.slots[b] : b;
  if (slot < 0 || (a.slots && slot >= a.num_slots)) {  // skipped row: zeros out, no state touched
    for (int64_t idx = threadIdx.x; idx < T * nv; idx += blockDim.x) {
      row(a.out, idx / nv)[col0 + idx % nv] = out_t(0);
    }
    return;
  }
  A* S = reinterpret_cast<A*>(smem_raw);               // [dk, kLightningCols]
  A* q = S + dk * kLightningCols;                      // [kLightningTokens, dk]
  A* k = q + kLightningTokens * dk;                    // [kLightningTokens, dk]
  A* v = k + kLightningTokens * dk;                    // [kLightningTokens, kLightningCols]
  A* p = v + kLightningTokens * kLightningCols;        // [kLightningTokens, kLightningTokens]
  A* pw = p + kLightningTokens * kLightningTokens;     // a^m, m in [0, kLightningTokens]
  const A slope = static_cast<A>(a.slope[h]);
  for (int m = threadIdx.x; m <= kLightningTokens; m += blockDim.x) {
    pw[m] = exp(-slope * A(m));
  }
  for (int idx = threadIdx.x; idx < dk * nv; idx += blockDim.x) {
    const int i = idx / nv, j = idx % nv;
    S[i * kLightningCols + j] =
        a.init.base ? a.init.base[slot * a.init.slot + h * a.init.head + i * a.init.row + (col0 + j) * a.init.col]
                    : A(0);
  }
  for (int64_t s0 = 0; s0 < T; s0 += kLightningTokens) {
    const int n = static_cast<int>(T - s0 < kLightningTokens ? T - s0 : kLightningTokens);
    const bool young = s0 == 0 && !a.decay_initial;  // the first block reads the initial state one step younger
    __syncthreads();
    for (int idx = threadIdx.x; idx < n * dk; idx += blockDim.x) {
      const int i = idx / dk, d = idx % dk;
      q[idx] = static_cast<A>(row(a.qq, s0 + i)[d]);
      k[idx] = static_cast<A>(row(a.kk, s0 + i)[d]);
    }
    for (int idx = threadIdx.x; idx < n * nv; idx += blockDim.x) {
      const int i = idx / nv, j = idx % nv;
      v[i * kLightningCols + j] = static_cast<A>(row(a.vv, s0 + i)[col0 + j]);
    }
    __syncthreads();
    // Causal decay mask applied to q k^T; masked entries are set (a NaN key never reaches an earlier row).
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int i = idx / n, j = idx % n;
      A dot = 0;
      if (j <= i) {
        for (int d = 0; d < dk; ++d) {
          dot += q[i * dk + d] * k[j * dk + d];
        }
        dot *= pw[i - j] * a.out_scale * a.kv_scale;
      }
      p[i * kLightningTokens + j] = dot;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n * nv; idx += blockDim.x) {
      const int i = idx / nv, j = idx % nv;
      A intra = 0, inter = 0;
      for (int m = 0; m <= i; ++m) {
        intra += p[i * kLightningTokens + m] * v[m * kLightningCols + j];
      }
      for (int d = 0; d < dk; ++d) {
        inter += q[i * dk + d] * S[d * kLightningCols + j];
      }
      row(a.out, s0 + i)[col0 + j] = static_cast<out_t>(intra + a.out_scale * pw[young ? i : i + 1] * inter);
    }
    __syncthreads();
    const A block_decay = pw[young ? n - 1 : n];
    for (int idx = threadIdx.x; idx < dk * nv; idx += blockDim.x) {
      const int d = idx / nv, j = idx % nv;
      A add = 0;
      for (int m = 0; m < n; ++m) {
        add += pw[n - 1 - m] * k[m * dk + d] * v[m * kLightningCols + j];
      }
      S[d * kLightningCols + j] = block_decay * S[d * kLightningCols + j] + a.kv_scale * add;
    }
  }
  __syncthreads();
  if (a.fin.base) {
    for (int idx = threadIdx.x; idx < dk * nv; idx += blockDim.x) {
      const int i = idx / nv, j = idx % nv;
      a.fin.base[slot * a.fin.slot + h * a.fin.head + i * a.fin.row + (col0 + j) * a.fin.col] =
          S[i * kLightningCols + j];
    }
  }
}

template <typename A>
constexpr size_t lightning_smem_bytes(int64_t dk) {
  return sizeof(A) * (dk * kLightningCols + 2 * kLightningTokens * dk + kLightningTokens * kLightningCols +
                      kLightningTokens * kLightningTokens + kLightningTokens + 1);
}

}  // namespace attn_ops::cuda
