// One stream of the lightning recurrence on the CPU: a single (sequence, query head, value-column chunk),
//   S_t = a * S_{t-1} + kv_scale * kk_t^T vv_t,   o_t = out_scale * qq_t S_t,   a = exp(-slope),
// computed block-wise (intra-block left product with the causal decay mask, inter-block right product with
// the running state), or token by token for very short streams. The forward pass and the three backward
// passes (dq forward in time, dk and dv reversed in time) are all this one recurrence with other operands.
#pragma once

#include "common/cpu/blas.h"
#include "lightning/validation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace attn_ops::cpu {

template <typename acc_t>
struct StreamParams {
  int64_t length = 0;       // tokens of the stream
  int64_t block = 64;       // block length of the chunked algorithm
  acc_t slope = 0;          // decay rate, a = exp(-slope)
  acc_t out_scale = 1;      // multiplies qq_t S_t
  acc_t kv_scale = 1;       // multiplies each kk_t^T vv_t added to the state
  bool reverse = false;     // walk the tokens from the last to the first
  bool decay_initial = true;  // the initial state decays before the first token (false: S_1 = S_0 + kv_1)
};

// Operand rows: row r (in memory order) of width `width` at base + r * stride; stride 1 inside a row.
template <typename T>
struct Rows {
  const T* base;
  int64_t stride;
};

template <typename acc_t>
struct StreamScratch {
  std::vector<acc_t> q, k, v, p, o, qdec, kdec, mask;
};

namespace detail {

// Copies n rows of width w (in stream order) into a contiguous acc_t buffer [n, w].
template <typename in_t, typename acc_t>
void gather(const Rows<in_t>& src, int64_t first, int64_t n, int64_t w, int64_t length, bool reverse, acc_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = reverse ? length - 1 - (first + i) : first + i;
    const in_t* s = src.base + r * src.stride;
    acc_t* d = dst + i * w;
    for (int64_t j = 0; j < w; ++j) {
      d[j] = static_cast<acc_t>(s[j]);
    }
  }
}

template <typename out_t, typename acc_t>
void scatter(const acc_t* src, int64_t first, int64_t n, int64_t w, int64_t length, bool reverse, out_t* base,
             int64_t stride) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = reverse ? length - 1 - (first + i) : first + i;
    out_t* d = base + r * stride;
    const acc_t* s = src + i * w;
    for (int64_t j = 0; j < w; ++j) {
      d[j] = static_cast<out_t>(s[j]);
    }
  }
}

}  // namespace detail

// Runs one stream. qq, kk: rows of width dk; vv: rows of width nv; out: rows of width nv. S: the state
// [dk, nv] with row stride lds, holding the initial state on entry and the final state on return.
template <typename in_t, typename out_t, typename acc_t>
void run_stream(const StreamParams<acc_t>& sp, Rows<in_t> qq, Rows<in_t> kk, int64_t dk, Rows<in_t> vv, int64_t nv,
                out_t* out, int64_t out_stride, acc_t* S, int64_t lds, StreamScratch<acc_t>& sc) {
  const int64_t T = sp.length;
  if (T == 0 || nv == 0) {
    return;
  }
  const acc_t a = std::exp(-sp.slope);
  if (T <= kLightningTokenLoopMax) {
    // One fused pass over the state per token: decay, add kk^T vv, and read it out with qq.
    sc.q.resize(dk);
    sc.k.resize(dk);
    sc.v.resize(nv);
    sc.o.resize(nv);
    for (int64_t t = 0; t < T; ++t) {
      detail::gather(qq, t, 1, dk, T, sp.reverse, sc.q.data());
      detail::gather(kk, t, 1, dk, T, sp.reverse, sc.k.data());
      detail::gather(vv, t, 1, nv, T, sp.reverse, sc.v.data());
      const acc_t decay = (t == 0 && !sp.decay_initial) ? acc_t(1) : a;
      acc_t* o = sc.o.data();
      const acc_t* v = sc.v.data();
      std::fill(o, o + nv, acc_t(0));
      for (int64_t i = 0; i < dk; ++i) {
        const acc_t ki = sc.k[i] * sp.kv_scale, qi = sc.q[i] * sp.out_scale;
        acc_t* row = S + i * lds;
        for (int64_t j = 0; j < nv; ++j) {
          row[j] = decay * row[j] + ki * v[j];
          o[j] += qi * row[j];
        }
      }
      detail::scatter(o, t, 1, nv, T, sp.reverse, out, out_stride);
    }
    return;
  }
  const int64_t c = std::min(sp.block, T);
  // Decays of a full block: qdec[i] = a^(i+1) (row i reads the state entering the block), kdec[j] =
  // a^(c-1-j) (key j's age at the block's end), mask[i, j] = a^(i-j) for j <= i (the causal decay mask).
  sc.qdec.resize(c);
  sc.kdec.resize(c);
  sc.mask.resize(c * c);
  for (int64_t i = 0; i < c; ++i) {
    sc.qdec[i] = std::exp(-sp.slope * acc_t(i + 1));
    sc.kdec[i] = std::exp(-sp.slope * acc_t(c - 1 - i)) * sp.kv_scale;
    for (int64_t j = 0; j <= i; ++j) {
      sc.mask[i * c + j] = std::exp(-sp.slope * acc_t(i - j)) * sp.out_scale * sp.kv_scale;
    }
  }
  sc.q.resize(c * dk);
  sc.k.resize(c * dk);
  sc.v.resize(c * nv);
  sc.o.resize(c * nv);
  sc.p.resize(c * c);
  acc_t *q = sc.q.data(), *k = sc.k.data(), *v = sc.v.data(), *o = sc.o.data(), *p = sc.p.data();
  for (int64_t start = 0; start < T; start += c) {
    const int64_t n = std::min(c, T - start);
    // Without decay_initial the first block reads the initial state one decay step younger.
    const bool young = start == 0 && !sp.decay_initial;
    detail::gather(qq, start, n, dk, T, sp.reverse, q);
    detail::gather(kk, start, n, dk, T, sp.reverse, k);
    detail::gather(vv, start, n, nv, T, sp.reverse, v);
    // Intra-block: o = ((q k^T) * mask) v. Masked entries are set, not multiplied, so a NaN in a later key
    // never reaches an earlier row.
    gemm<acc_t>(false, true, n, n, dk, acc_t(1), q, dk, k, dk, acc_t(0), p, n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        p[i * n + j] *= sc.mask[i * c + j];
      }
      std::fill(p + i * n + i + 1, p + (i + 1) * n, acc_t(0));
    }
    gemm<acc_t>(false, false, n, nv, n, acc_t(1), p, n, v, nv, acc_t(0), o, nv);
    // Inter-block: o += out_scale * (q * qdec) S.
    for (int64_t i = 0; i < n; ++i) {
      const acc_t d = (young ? (i == 0 ? acc_t(1) : sc.qdec[i - 1]) : sc.qdec[i]) * sp.out_scale;
      for (int64_t j = 0; j < dk; ++j) {
        q[i * dk + j] *= d;
      }
    }
    gemm<acc_t>(false, false, n, nv, dk, acc_t(1), q, dk, S, lds, acc_t(1), o, nv);
    // State: S = a^n S + (k * kdec)^T v (a partial block uses the last n key decays).
    for (int64_t i = 0; i < n; ++i) {
      const acc_t d = sc.kdec[i + c - n];
      for (int64_t j = 0; j < dk; ++j) {
        k[i * dk + j] *= d;
      }
    }
    const int64_t steps = young ? n - 1 : n;
    const acc_t block_decay = steps == 0 ? acc_t(1) : sc.qdec[steps - 1];
    gemm<acc_t>(true, false, dk, nv, n, acc_t(1), k, dk, v, nv, block_decay, S, lds);
    detail::scatter(o, start, n, nv, T, sp.reverse, out, out_stride);
  }
}

}  // namespace attn_ops::cpu
