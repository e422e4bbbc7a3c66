// Plain tensor-math references and a closeness check shared by the C++ tests (float64 ground truth).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

namespace attn_ops_test {

// Plain-math reference for dense inputs q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv]:
// repeat KV heads, matmul, bottom-right aligned mask, softmax, matmul. Returns (out [B, Tq, Hq, Dv],
// lse [B, Hq, Tq]) in the dtype of the inputs (call it with float64 tensors). Differentiable.
// A query row with no visible key gets out = 0 and lse = -inf.
inline std::tuple<at::Tensor, at::Tensor> reference_attention(const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v, std::optional<double> scale,
                                                               bool causal, int64_t window_left, int64_t window_right) {
  const int64_t Tq = q.size(1), Tk = k.size(1), Hq = q.size(2), Hkv = k.size(2);
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  const at::Tensor qh = q.permute({0, 2, 1, 3});                                   // [B, Hq, Tq, D]
  const at::Tensor kh = k.repeat_interleave(Hq / Hkv, /*dim=*/2).permute({0, 2, 1, 3});  // [B, Hq, Tk, D]
  const at::Tensor vh = v.repeat_interleave(Hq / Hkv, /*dim=*/2).permute({0, 2, 1, 3});  // [B, Hq, Tk, Dv]
  at::Tensor logits = at::matmul(qh, kh.transpose(-1, -2)) * s;                      // [B, Hq, Tq, Tk]

  if (causal) window_right = 0;
  const auto idx_opts = torch::TensorOptions().dtype(torch::kLong);
  const at::Tensor i = torch::arange(Tq, idx_opts).unsqueeze(1);
  const at::Tensor j = torch::arange(Tk, idx_opts).unsqueeze(0);
  const int64_t offset = Tk - Tq;
  at::Tensor visible = torch::ones({Tq, Tk}, torch::TensorOptions().dtype(torch::kBool));
  if (window_left >= 0) visible = visible.logical_and(j >= i + (offset - window_left));
  if (window_right >= 0) visible = visible.logical_and(j <= i + (offset + window_right));
  logits = logits.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());

  const at::Tensor lse = at::logsumexp(logits, /*dim=*/-1);                         // [B, Hq, Tq]
  // Like softmax, but rows without a visible key give 0 instead of NaN.
  const at::Tensor lse_safe = at::where(lse.isinf(), at::zeros_like(lse), lse);
  const at::Tensor probs = at::exp(logits - lse_safe.unsqueeze(-1));
  const at::Tensor out = at::matmul(probs, vh).permute({0, 2, 1, 3});              // [B, Tq, Hq, Dv]
  return {out, lse};
}

// Elementwise |actual - expected| <= atol + rtol * |expected|, with a readable failure message.
inline void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                         const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what << ": shape mismatch";
  const at::Tensor a = actual.detach().to(torch::kDouble);
  const at::Tensor e = expected.detach().to(torch::kDouble);
  ASSERT_FALSE(a.isnan().any().item<bool>()) << what << " contains NaN";
  ASSERT_FALSE(e.isnan().any().item<bool>()) << "reference for " << what << " contains NaN";
  const at::Tensor err = (a - e).abs();
  const at::Tensor bad = err > (atol + rtol * e.abs());
  EXPECT_FALSE(bad.any().item<bool>())
      << what << ": " << bad.sum().item<int64_t>() << " of " << a.numel()
      << " elements out of tolerance (rtol " << rtol << ", atol " << atol
      << "), max abs error " << err.max().item<double>() << ", max |expected| " << e.abs().max().item<double>();
}

}  // namespace attn_ops_test
