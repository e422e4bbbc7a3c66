// C++ (LibTorch) tests of attn_ops::rotary_embedding / rotary_embedding_ through the C++ API: values against
// plain tensor math in float64, the gradient (the inverse rotation), and the in-place op writing the same
// values. Contract: docs/rotary_api.md.
#include "attn_ops.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

// Half-split rotation of the first 2 * cos.size(1) features of x [B, T, H, D] at positions [B, T]:
// pair (x[i], x[i + R/2]) -> (a c - b s, b c + a s), sign -1 rotating backwards.
at::Tensor reference_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, double sign) {
  const int64_t half = cos.size(1);
  const at::Tensor c = cos.index_select(0, positions.flatten()).view({x.size(0), x.size(1), 1, half});
  const at::Tensor s = sin.index_select(0, positions.flatten()).view({x.size(0), x.size(1), 1, half}) * sign;
  const at::Tensor a = x.narrow(-1, 0, half), b = x.narrow(-1, half, half);
  const at::Tensor rest = x.narrow(-1, 2 * half, x.size(-1) - 2 * half);
  return torch::cat({a * c - b * s, b * c + a * s, rest}, -1);
}

struct RotaryInputs {
  at::Tensor x, cos, sin, positions;
};

// x [2, 5, 3, 10] with rotary_dim 6 (partial rotary: 4 features pass through), positions in [0, 16).
RotaryInputs make_inputs() {
  torch::manual_seed(7);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  const at::Tensor angle = torch::rand({16, 3}, f64) * 6.0;
  return {torch::randn({2, 5, 3, 10}, f64), angle.cos(), angle.sin(),
          torch::randint(0, 16, {2, 5}, torch::TensorOptions().dtype(torch::kLong))};
}

TEST(Rotary, MatchesReferenceAndInverse) {
  const RotaryInputs in = make_inputs();
  const at::Tensor out = attn_ops::rotary_embedding(in.x, in.cos, in.sin, in.positions);
  EXPECT_TRUE(torch::allclose(out, reference_rotary(in.x, in.cos, in.sin, in.positions, 1.0), 1e-12, 1e-12));
  const at::Tensor back = attn_ops::rotary_embedding(out, in.cos, in.sin, in.positions, /*interleaved=*/false,
                                                     /*inverse=*/true);
  EXPECT_TRUE(torch::allclose(back, in.x, 1e-12, 1e-12));
}

TEST(Rotary, GradientIsInverseRotation) {
  const RotaryInputs in = make_inputs();
  const at::Tensor x = in.x.clone().requires_grad_(true);
  const at::Tensor grad_out = torch::randn_like(in.x);
  attn_ops::rotary_embedding(x, in.cos, in.sin, in.positions).backward(grad_out);
  EXPECT_TRUE(torch::allclose(x.grad(), reference_rotary(grad_out, in.cos, in.sin, in.positions, -1.0), 1e-12, 1e-12));
}

TEST(Rotary, InPlaceWritesTheSameValues) {
  const RotaryInputs in = make_inputs();
  const at::Tensor expected = attn_ops::rotary_embedding(in.x, in.cos, in.sin, in.positions, /*interleaved=*/true);
  const at::Tensor x = in.x.clone();
  attn_ops::rotary_embedding_(x, in.cos, in.sin, in.positions, /*interleaved=*/true);
  EXPECT_TRUE(torch::equal(x, expected));
  EXPECT_FALSE(torch::equal(x, in.x));
}

}  // namespace
