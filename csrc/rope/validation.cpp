// Argument checks of the rotary embedding ops, shared by every backend.
#include "rope/validation.h"

#include "common/checks.h"
#include "common/index_checks.h"

#include <ATen/ATen.h>

namespace attn_ops {

void check_rotary_inputs(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& positions) {
  check_float_dtype(op, "x", x);
  TORCH_CHECK(x.dim() >= 2, op, ": x must have at least 2 dimensions [..., heads, head_dim], got a ", x.dim(),
              "-D tensor of shape ", shape_str(x));
  TORCH_CHECK(x.dim() <= kRotaryMaxDims, op, ": x must have at most ", kRotaryMaxDims,
              " dimensions [..., heads, head_dim], got a ", x.dim(), "-D tensor of shape ", shape_str(x));
  check_last_dim_contiguous(op, "x", x);
  const c10::SymIntArrayRef leading = x.sym_sizes().slice(0, x.dim() - 2);
  check_index_tensor(op, "positions", positions, /*allow_int64=*/true, positions.sym_sizes() == leading,
                     [&] { return shape_str(leading) + " (the leading dims of x)"; });
  const bool cos_dtype_ok = cos.scalar_type() == at::kFloat || cos.scalar_type() == x.scalar_type();
  TORCH_CHECK(cos.dim() == 2 && cos_dtype_ok, op, ": cos must be a 2-D tensor [max_positions, rotary_dim / 2] of dtype ",
              "float32 or ", dtype_name(x.scalar_type()), " (as x), got ", dtype_name(cos.scalar_type()),
              " tensor of shape ", shape_str(cos));
  TORCH_CHECK(sin.sym_sizes() == cos.sym_sizes() && sin.scalar_type() == cos.scalar_type(), op,
              ": sin must have the shape and dtype of cos (", shape_str(cos), " ", dtype_name(cos.scalar_type()),
              "), got ", shape_str(sin), " ", dtype_name(sin.scalar_type()));
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"cos", cos}, {"sin", sin},
                                {"positions", positions}}) {
    TORCH_CHECK(t.device() == x.device(), op, ": cos, sin and positions must be on the same device as x (",
                x.device(), "), got ", name, " on ", t.device());
  }
  TORCH_CHECK(2 * cos.sym_size(1) <= x.sym_size(-1), op, ": rotary_dim 2 * ", cos.sym_size(1), " = ",
              2 * cos.sym_size(1), " exceeds head_dim ", x.sym_size(-1));
  if (can_read_values(positions)) {
    check_position_values(op, positions, cos.size(0));
  }
}

void check_rotary_inplace_inputs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& positions) {
  const char* op = "attn_ops.rotary_embedding_";
  check_rotary_inputs(op, x, cos, sin, positions);
  check_in_place_target(op, {"x", x}, {{"cos", cos}, {"sin", sin}, {"positions", positions}});
}

}  // namespace attn_ops
