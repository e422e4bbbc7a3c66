// CPU kernels of the rotary embedding: each (token, head) row rotates its first rotary_dim features in
// pairs, in float32 (float64 for float64), from `src` into `dst` (the same tensor for the in-place op).
#include "rope/validation.h"

#include "common/acc_type.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

namespace attn_ops::cpu {
namespace {

// Element offset of every token (the flattened leading dims of x).
std::vector<int64_t> token_offsets(const at::Tensor& x) {
  const int64_t lead = x.dim() - 2;
  int64_t tokens = 1;
  for (int64_t d = 0; d < lead; ++d) {
    tokens *= x.size(d);
  }
  std::vector<int64_t> offsets(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t offset = 0;
    for (int64_t d = lead - 1, rest = t; d >= 0; --d) {
      offset += (rest % x.size(d)) * x.stride(d);
      rest /= x.size(d);
    }
    offsets[t] = offset;
  }
  return offsets;
}

template <typename scalar_t, typename table_t>
void rotate(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& cos, const at::Tensor& sin,
            const at::Tensor& positions, bool interleaved, bool inverse) {
  using acc_t = acc_type<scalar_t>;
  const std::vector<int64_t> src_off = token_offsets(src), dst_off = token_offsets(dst);
  const at::Tensor pos = positions.to(at::kLong).contiguous();
  const at::Tensor cos_c = cos.contiguous(), sin_c = sin.contiguous();
  const int64_t* p = pos.const_data_ptr<int64_t>();
  const table_t* cos_t = cos_c.const_data_ptr<table_t>();
  const table_t* sin_t = sin_c.const_data_ptr<table_t>();
  const int64_t heads = src.size(-2), dim = src.size(-1), half = cos.size(1);
  const int64_t src_h = src.stride(-2), dst_h = dst.stride(-2);
  const scalar_t* in = src.const_data_ptr<scalar_t>();
  scalar_t* out = dst.mutable_data_ptr<scalar_t>();
  const bool same = src.data_ptr() == dst.data_ptr();
  // (a, b) -> (a c - b s, b c + a s); the inverse rotation flips the sign of s.
  const acc_t sign = inverse ? acc_t(-1) : acc_t(1);
  at::parallel_for(0, static_cast<int64_t>(src_off.size()), 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const table_t* c = cos_t + p[t] * half;
      const table_t* s = sin_t + p[t] * half;
      for (int64_t h = 0; h < heads; ++h) {
        const scalar_t* x = in + src_off[t] + h * src_h;
        scalar_t* y = out + dst_off[t] + h * dst_h;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
          const acc_t a = static_cast<acc_t>(x[ia]), b = static_cast<acc_t>(x[ib]);
          const acc_t ci = static_cast<acc_t>(c[i]), si = sign * static_cast<acc_t>(s[i]);
          y[ia] = static_cast<scalar_t>(a * ci - b * si);
          y[ib] = static_cast<scalar_t>(b * ci + a * si);
        }
        if (!same) {  // features past rotary_dim pass through
          for (int64_t d = 2 * half; d < dim; ++d) {
            y[d] = x[d];
          }
        }
      }
    }
  });
}

void rotate_dispatch(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& positions, bool interleaved, bool inverse) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "attn_ops.rotary_embedding", [&] {
    if (cos.scalar_type() == src.scalar_type()) {
      rotate<scalar_t, scalar_t>(src, dst, cos, sin, positions, interleaved, inverse);
    } else {
      rotate<scalar_t, float>(src, dst, cos, sin, positions, interleaved, inverse);
    }
  });
}

at::Tensor rotary_embedding_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                const at::Tensor& positions, bool interleaved, bool inverse) {
  check_rotary_inputs("attn_ops.rotary_embedding", x, cos, sin, positions);
  at::Tensor out = at::empty(x.sizes(), x.options());
  rotate_dispatch(x, out, cos, sin, positions, interleaved, inverse);
  return out;
}

void rotary_embedding__cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& positions, bool interleaved, bool inverse) {
  check_rotary_inplace_inputs(x, cos, sin, positions);
  rotate_dispatch(x, x, cos, sin, positions, interleaved, inverse);
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("rotary_embedding", &rotary_embedding_cpu);
  m.impl("rotary_embedding_", &rotary_embedding__cpu);
}

}  // namespace attn_ops::cpu
