// C++ (LibTorch) tests of attn_ops::attention: forward and backward against plain tensor math in float64,
// error reporting, and operator registration in the dispatcher. Contract: docs/attention_api.md.
#include "attn_ops.h"
#include "reference.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>

namespace {

using attn_ops_test::expect_close;
using attn_ops_test::reference_attention;

struct Case {
  torch::Dtype dtype;
  bool causal;
  int64_t window_left = -1;
  int64_t window_right = -1;
  std::optional<double> scale = std::nullopt;
  bool noncontiguous = false;  // q/k/v as transposed views (stride 1 only in the last dim)
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << (c.dtype == torch::kDouble ? "float64" : "float32") << (c.causal ? "_causal" : "_full");
  if (c.window_left >= 0 || c.window_right >= 0) s << "_window" << c.window_left << "x" << c.window_right;
  if (c.scale) s << "_scaled";
  if (c.noncontiguous) s << "_strided";
  return s.str();
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return describe(info.param); }

// GoogleTest prints parameters with this (instead of a byte dump) in test names and failure messages.
void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

// Fresh standard-normal input of logical shape [b, t, h, d]; as a transposed view of a [b, h, t, d]
// tensor when non-contiguous.
at::Tensor random_input(int64_t b, int64_t t, int64_t h, int64_t d, torch::Dtype dtype, bool noncontiguous) {
  const auto opts = torch::TensorOptions().dtype(dtype);
  if (noncontiguous) return torch::randn({b, h, t, d}, opts).transpose(1, 2);
  return torch::randn({b, t, h, d}, opts);
}

class AttentionVsReference : public ::testing::TestWithParam<Case> {
 protected:
  static constexpr int64_t B = 2, Tq = 37, Tk = 53, Hq = 8, Hkv = 2, D = 64;

  double rtol() const { return GetParam().dtype == torch::kDouble ? 1e-9 : 1e-4; }
  double atol() const { return GetParam().dtype == torch::kDouble ? 1e-9 : 1e-4; }
};

TEST_P(AttentionVsReference, Forward) {
  const Case& c = GetParam();
  torch::manual_seed(1234);
  const at::Tensor q = random_input(B, Tq, Hq, D, c.dtype, c.noncontiguous);
  const at::Tensor k = random_input(B, Tk, Hkv, D, c.dtype, c.noncontiguous);
  const at::Tensor v = random_input(B, Tk, Hkv, D, c.dtype, c.noncontiguous);

  const auto [out, lse] = attn_ops::attention(q, k, v, c.scale, c.causal, c.window_left, c.window_right);
  const auto [ref_out, ref_lse] = reference_attention(q.to(torch::kDouble), k.to(torch::kDouble),
                                                      v.to(torch::kDouble), c.scale, c.causal, c.window_left,
                                                      c.window_right);

  EXPECT_EQ(out.sizes(), (c10::IntArrayRef{B, Tq, Hq, D}));
  EXPECT_EQ(out.scalar_type(), c.dtype);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_EQ(lse.sizes(), (c10::IntArrayRef{B, Hq, Tq}));
  EXPECT_EQ(lse.scalar_type(), c.dtype == torch::kDouble ? torch::kDouble : torch::kFloat);
  expect_close(out, ref_out, rtol(), atol(), "out");
  expect_close(lse, ref_lse, rtol(), atol(), "lse");
}

TEST_P(AttentionVsReference, Backward) {
  const Case& c = GetParam();
  torch::manual_seed(4321);
  const at::Tensor q = random_input(B, Tq, Hq, D, c.dtype, c.noncontiguous).detach().requires_grad_(true);
  const at::Tensor k = random_input(B, Tk, Hkv, D, c.dtype, c.noncontiguous).detach().requires_grad_(true);
  const at::Tensor v = random_input(B, Tk, Hkv, D, c.dtype, c.noncontiguous).detach().requires_grad_(true);
  const at::Tensor w_out = torch::randn({B, Tq, Hq, D}, torch::TensorOptions().dtype(torch::kDouble));
  const at::Tensor w_lse = torch::randn({B, Hq, Tq}, torch::TensorOptions().dtype(torch::kDouble));

  const auto [out, lse] = attn_ops::attention(q, k, v, c.scale, c.causal, c.window_left, c.window_right);
  ASSERT_TRUE(out.requires_grad()) << "attention output does not require grad: no autograd kernel?";
  ASSERT_TRUE(lse.requires_grad()) << "lse does not require grad: no autograd kernel?";
  const at::Tensor loss = (out * w_out.to(out.scalar_type())).sum() + (lse * w_lse.to(lse.scalar_type())).sum();
  loss.backward();

  const at::Tensor qr = q.detach().to(torch::kDouble).requires_grad_(true);
  const at::Tensor kr = k.detach().to(torch::kDouble).requires_grad_(true);
  const at::Tensor vr = v.detach().to(torch::kDouble).requires_grad_(true);
  const auto [ref_out, ref_lse] = reference_attention(qr, kr, vr, c.scale, c.causal, c.window_left, c.window_right);
  const at::Tensor ref_loss = (ref_out * w_out).sum() + (ref_lse * w_lse).sum();
  ref_loss.backward();

  for (const auto& [name, grad, ref, input] :
       {std::tuple{"dq", q.grad(), qr.grad(), q}, std::tuple{"dk", k.grad(), kr.grad(), k},
        std::tuple{"dv", v.grad(), vr.grad(), v}}) {
    ASSERT_TRUE(grad.defined()) << name << " is undefined";
    EXPECT_EQ(grad.scalar_type(), c.dtype) << name;
    EXPECT_EQ(grad.sizes(), input.sizes()) << name;
    EXPECT_GT(ref.abs().max().item<double>(), 0.0) << "reference " << name << " is all zero";
    expect_close(grad, ref, rtol(), atol(), name);
  }
}

INSTANTIATE_TEST_SUITE_P(
    GQA, AttentionVsReference,
    ::testing::Values(Case{torch::kFloat, false}, Case{torch::kFloat, true}, Case{torch::kDouble, false},
                      Case{torch::kDouble, true},
                      Case{torch::kDouble, false, /*window_left=*/7, /*window_right=*/3},
                      Case{torch::kFloat, true, -1, -1, /*scale=*/0.3, /*noncontiguous=*/true}),
    case_name);

// Bottom-right alignment with seqlen_q > seqlen_k: the first Tq - Tk causal query rows see no key and
// must give out = 0 and lse = -inf (never NaN); the other rows match the reference.
TEST(Attention, CausalRowsWithoutKeys) {
  torch::manual_seed(99);
  const int64_t B = 1, Tq = 9, Tk = 4, Hq = 4, Hkv = 2, D = 16;
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const at::Tensor q = torch::randn({B, Tq, Hq, D}, opts);
  const at::Tensor k = torch::randn({B, Tk, Hkv, D}, opts);
  const at::Tensor v = torch::randn({B, Tk, Hkv, D}, opts);
  const auto [out, lse] = attn_ops::attention(q, k, v, std::nullopt, /*causal=*/true);
  const auto [ref_out, ref_lse] = reference_attention(q, k, v, std::nullopt, true, -1, -1);

  const int64_t empty = Tq - Tk;  // rows 0 .. Tq - Tk - 1 see no key
  EXPECT_FALSE(out.isnan().any().item<bool>());
  EXPECT_FALSE(lse.isnan().any().item<bool>());
  EXPECT_TRUE(out.narrow(1, 0, empty).eq(0).all().item<bool>()) << "out of rows without keys must be 0";
  const at::Tensor empty_lse = lse.narrow(2, 0, empty);
  EXPECT_TRUE((empty_lse.isinf() & (empty_lse < 0)).all().item<bool>()) << "lse of rows without keys must be -inf";
  expect_close(out.narrow(1, empty, Tq - empty), ref_out.narrow(1, empty, Tq - empty), 1e-9, 1e-9, "out");
  expect_close(lse.narrow(2, empty, Tq - empty), ref_lse.narrow(2, empty, Tq - empty), 1e-9, 1e-9, "lse");
}

TEST(Attention, HeadsNotMultipleThrows) {
  torch::manual_seed(7);
  const at::Tensor q = torch::randn({2, 5, 6, 32});
  const at::Tensor k = torch::randn({2, 5, 4, 32});
  const at::Tensor v = torch::randn({2, 5, 4, 32});
  try {
    attn_ops::attention(q, k, v);
    FAIL() << "expected c10::Error for heads_q 6, heads_kv 4";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("must be a multiple of heads_kv"), std::string::npos) << what;
    EXPECT_NE(what.find("heads_q (6) must be a multiple of heads_kv (4)"), std::string::npos) << what;
  }
}

TEST(Attention, RegisteredInDispatcher) {
  for (const char* name : {"attn_ops::attention", "attn_ops::attention_backward"}) {
    const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    ASSERT_TRUE(op.has_value()) << name << " is not registered (library dropped at link time?)";
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) << name << " has no CPU kernel";
  }
  const auto op = c10::Dispatcher::singleton().findSchema({"attn_ops::attention", ""});
  ASSERT_TRUE(op.has_value());
  // Registered kernels (not the computed table, which holds the global autograd fallback anyway).
  EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::Autograd) ||
              op->hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU))
      << "attn_ops::attention has no autograd kernel";
}

}  // namespace
