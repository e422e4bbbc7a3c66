// CPU backward of additive_attention. For a pair (i, j) with t = tanh(qp_i + kp_j), s = w . t,
// p = exp(s - lse_i) and ds = p * (dout_i . v_j - dout_i . out_i + dlse_i):
//   dqp_i += ds * w * (1 - t^2),  dkp_j += ds * w * (1 - t^2),  dw += ds * t,  dv_j += p * dout_i.
// t is recomputed per pair into an [hidden] scratch row (never [Tq, Tk, hidden]). Query rows are split
// into a fixed number of chunks (one per thread of the pool); each chunk accumulates dkp / dv / dw in its
// own buffer, summed at the end. The chunks, not the threads that happen to run them, own the buffers, so
// the sums do not depend on how OpenMP shares the work out: two identical calls give identical gradients.
#include "additive/cpu/score.h"
#include "additive/validation.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace attn_ops::cpu {
namespace {

struct BackwardInputs {
  at::Tensor qp, kp, w, v, dout, out, lse, dlse;  // acc dtype, contiguous; dlse undefined when absent
  const bool* mask;                               // [batch, key_len] or nullptr
};

template <typename acc_t>
void backward_rows(const BackwardInputs& in,
                   const at::Tensor& dqp,        // [batch, query_len, hidden] acc_t
                   const at::Tensor& dkp_parts,  // [chunks, batch, key_len, hidden] acc_t, zeros
                   const at::Tensor& dv_parts,   // [chunks, batch, key_len, value_dim] acc_t, zeros
                   const at::Tensor& dw_parts) { // [chunks, hidden] acc_t, zeros
  const int64_t B = in.qp.size(0), Tq = in.qp.size(1), Tk = in.kp.size(1), A = in.qp.size(2), Dv = in.v.size(2);
  const AdditiveScorer<acc_t> score(in.qp, in.kp, in.w);
  const acc_t* W = in.w.const_data_ptr<acc_t>();
  const acc_t* V = in.v.const_data_ptr<acc_t>();
  const acc_t* dO = in.dout.const_data_ptr<acc_t>();
  const acc_t* O = in.out.const_data_ptr<acc_t>();
  const acc_t* L = in.lse.const_data_ptr<acc_t>();
  const acc_t* dL = in.dlse.defined() ? in.dlse.const_data_ptr<acc_t>() : nullptr;
  acc_t* dQ = dqp.mutable_data_ptr<acc_t>();
  const int64_t chunks = dkp_parts.size(0);
  const int64_t rows_per_chunk = (B * Tq + chunks - 1) / chunks;
  at::parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t c = chunk_begin; c < chunk_end; ++c) {
      acc_t* dK = dkp_parts.mutable_data_ptr<acc_t>() + c * B * Tk * A;
      acc_t* dV = dv_parts.mutable_data_ptr<acc_t>() + c * B * Tk * Dv;
      acc_t* dW = dw_parts.mutable_data_ptr<acc_t>() + c * A;
      std::vector<acc_t> t(A);
      for (int64_t r = c * rows_per_chunk; r < std::min(B * Tq, (c + 1) * rows_per_chunk); ++r) {
        const int64_t b = r / Tq;
        const acc_t* dout = dO + r * Dv;
        acc_t* dq = dQ + r * A;
        std::fill(dq, dq + A, acc_t(0));
        if (L[r] == -std::numeric_limits<acc_t>::infinity()) {
          continue;  // no visible key: the row's output is a constant zero
        }
        acc_t delta = 0;
        for (int64_t d = 0; d < Dv; ++d) {
          delta += dout[d] * O[r * Dv + d];
        }
        const acc_t shift = (dL ? dL[r] : acc_t(0)) - delta;
        for (int64_t j = 0; j < Tk; ++j) {
          const int64_t key = b * Tk + j;
          if (in.mask && in.mask[key]) {
            continue;
          }
          const acc_t p = std::exp(score.template pair<true>(b, r, key, t.data()) - L[r]);
          const acc_t* vj = V + key * Dv;
          acc_t* dvj = dV + key * Dv;
          acc_t dp = 0;
          for (int64_t d = 0; d < Dv; ++d) {
            dp += dout[d] * vj[d];
            dvj[d] += p * dout[d];
          }
          const acc_t ds = p * (dp + shift);
          acc_t* dkj = dK + key * A;
          for (int64_t a = 0; a < A; ++a) {
            const acc_t g = ds * W[a] * (acc_t(1) - t[a] * t[a]);
            dq[a] += g;
            dkj[a] += g;
            dW[a] += ds * t[a];
          }
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> additive_attention_backward_cpu(
    const at::Tensor& dout, const std::optional<at::Tensor>& dlse, const at::Tensor& qp, const at::Tensor& kp,
    const at::Tensor& w, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& key_padding_mask) {
  prepare_additive_attention_backward(dout, dlse, qp, kp, w, v, out, lse, key_padding_mask);
  const c10::ScalarType acc = additive_lse_dtype(qp);
  const auto prep = [&](const at::Tensor& x) { return x.to(acc).contiguous(); };
  const at::Tensor mask = key_padding_mask.has_value() ? key_padding_mask->contiguous() : at::Tensor();
  const BackwardInputs in{prep(qp),   prep(kp),  prep(w),   prep(v),
                          prep(dout), prep(out), prep(lse), dlse.has_value() ? prep(*dlse) : at::Tensor(),
                          mask.defined() ? mask.const_data_ptr<bool>() : nullptr};
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), qp.size(0) * qp.size(1)));
  const at::TensorOptions opts = qp.options().dtype(acc);
  at::Tensor dqp = at::empty(qp.sizes(), opts);
  at::Tensor dkp_parts = at::zeros({chunks, kp.size(0), kp.size(1), kp.size(2)}, opts);
  at::Tensor dv_parts = at::zeros({chunks, v.size(0), v.size(1), v.size(2)}, opts);
  at::Tensor dw_parts = at::zeros({chunks, w.size(0)}, opts);
  AT_DISPATCH_FLOATING_TYPES(acc, "additive_attention_backward_cpu",
                             [&] { backward_rows<scalar_t>(in, dqp, dkp_parts, dv_parts, dw_parts); });
  const c10::ScalarType dtype = qp.scalar_type();
  return {dqp.to(dtype), dkp_parts.sum(0).to(dtype), dw_parts.sum(0).to(dtype), dv_parts.sum(0).to(dtype)};
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("additive_attention_backward", &additive_attention_backward_cpu);
}

}  // namespace attn_ops::cpu
