// CPU forward of additive_attention: one query row per work item; keys are streamed in blocks with an
// online softmax, so memory is O(block) per thread on top of the inputs (never [Tq, Tk, hidden]).
#include "additive/cpu/score.h"
#include "additive/validation.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

namespace attn_ops::cpu {
namespace {

constexpr int64_t kKeyBlock = 128;

template <typename acc_t>
void forward_rows(const at::Tensor& qp,    // [batch, query_len, hidden] acc_t, contiguous
                  const at::Tensor& kp,    // [batch, key_len, hidden] acc_t, contiguous
                  const at::Tensor& w,     // [hidden] acc_t
                  const at::Tensor& v,     // [batch, key_len, value_dim] acc_t, contiguous
                  const bool* mask,        // [batch, key_len] or nullptr; true = padded key
                  const at::Tensor& out,   // [batch, query_len, value_dim] acc_t
                  const at::Tensor& lse,   // [batch, query_len] acc_t
                  acc_t* weights) {        // [batch, query_len, key_len] or nullptr
  const int64_t B = qp.size(0), Tq = qp.size(1), Tk = kp.size(1), Dv = v.size(2);
  const AdditiveScorer<acc_t> score(qp, kp, w);
  const acc_t* V = v.const_data_ptr<acc_t>();
  acc_t* O = out.mutable_data_ptr<acc_t>();
  acc_t* L = lse.mutable_data_ptr<acc_t>();
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  at::parallel_for(0, B * Tq, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> s(kKeyBlock);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / Tq;
      acc_t* o = O + r * Dv;
      acc_t* row_weights = weights ? weights + r * Tk : nullptr;
      std::fill(o, o + Dv, acc_t(0));
      acc_t m = kNegInf, l = 0;
      for (int64_t j0 = 0; j0 < Tk; j0 += kKeyBlock) {
        const int64_t n = std::min(kKeyBlock, Tk - j0);
        acc_t block_max = kNegInf;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t key = b * Tk + j0 + j;
          s[j] = (mask && mask[key]) ? kNegInf : score.template pair<false>(b, r, key, nullptr);
          block_max = nan_max(block_max, s[j]);
        }
        if (row_weights) {
          std::copy(s.begin(), s.begin() + n, row_weights + j0);  // raw scores, normalized below
        }
        const acc_t m_new = nan_max(m, block_max);
        if (m_new == kNegInf) {
          continue;  // every key so far is padded
        }
        const acc_t rescale = std::exp(m - m_new);
        l *= rescale;
        for (int64_t d = 0; d < Dv; ++d) {
          o[d] *= rescale;
        }
        for (int64_t j = 0; j < n; ++j) {
          const acc_t p = std::exp(s[j] - m_new);
          if (p == acc_t(0)) {
            continue;
          }
          l += p;
          const acc_t* vj = V + (b * Tk + j0 + j) * Dv;
          for (int64_t d = 0; d < Dv; ++d) {
            o[d] += p * vj[d];
          }
        }
        m = m_new;
      }
      // A row whose keys are all padded (or that has none) keeps o = 0 and gets lse = -inf.
      const acc_t row_lse = l == acc_t(0) ? kNegInf : m + std::log(l);
      if (l != acc_t(0)) {
        const acc_t inv = acc_t(1) / l;
        for (int64_t d = 0; d < Dv; ++d) {
          o[d] *= inv;
        }
      }
      L[r] = row_lse;
      if (row_weights) {
        for (int64_t j = 0; j < Tk; ++j) {
          row_weights[j] = row_lse == kNegInf ? acc_t(0) : std::exp(row_weights[j] - row_lse);
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> additive_attention_cpu(
    const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w, const at::Tensor& v,
    const std::optional<at::Tensor>& key_padding_mask, bool return_weights) {
  prepare_additive_attention(qp, kp, w, v, key_padding_mask);
  const int64_t B = qp.size(0), Tq = qp.size(1), Tk = kp.size(1), Dv = v.size(2);
  const c10::ScalarType acc = additive_lse_dtype(qp);
  // Inputs in the accumulation dtype, contiguous (no copy for contiguous float32/float64 inputs).
  const at::Tensor q = qp.to(acc).contiguous(), k = kp.to(acc).contiguous(), wc = w.to(acc).contiguous(),
                   vc = v.to(acc).contiguous();
  const at::Tensor mask = key_padding_mask.has_value() ? key_padding_mask->contiguous() : at::Tensor();
  at::Tensor out_acc = at::empty({B, Tq, Dv}, qp.options().dtype(acc));
  at::Tensor lse = at::empty({B, Tq}, qp.options().dtype(acc));
  at::Tensor weights_acc = return_weights ? at::empty({B, Tq, Tk}, qp.options().dtype(acc)) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(acc, "additive_attention_cpu", [&] {
    forward_rows<scalar_t>(q, k, wc, vc, mask.defined() ? mask.const_data_ptr<bool>() : nullptr, out_acc, lse,
                           return_weights ? weights_acc.mutable_data_ptr<scalar_t>() : nullptr);
  });
  at::Tensor weights = return_weights ? weights_acc.to(qp.scalar_type()) : at::empty({0}, qp.options());
  return {out_acc.to(qp.scalar_type()), lse, weights};
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("additive_attention", &additive_attention_cpu);
}

}  // namespace attn_ops::cpu
