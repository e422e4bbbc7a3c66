// Checks and output rules that every attention-like family shares (attention, MLA, lightning, additive): the
// floating-point operands, head counts and dims, the score options, the default scale and the (out, lse)
// shapes. Each check throws c10::Error naming the op, the argument, what was expected and what came.
#pragma once

#include "common/checks.h"

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

namespace attn_ops {

// The largest head dim of any attention op (the CUDA row kernels hold 32 features per lane).
constexpr int64_t kMaxHeadDim = 1024;

// The floating-point operands, checked in this order: the first float16, bfloat16, float32 or float64; every
// other one of its dtype and on its device; each with stride 1 in its last dim.
void check_float_operands(const char* op, std::initializer_list<NamedTensor> operands);

// Head dims in [1, kMaxHeadDim].
void check_head_dims(const char* op, const c10::SymInt& head_dim_qk, const c10::SymInt& head_dim_v);

// heads_q a multiple of heads_kv >= 1.
void check_head_counts(const char* op, const c10::SymInt& heads_q, const c10::SymInt& heads_kv);

// Windows >= -1; scale and softcap representable in the kernels' accumulation type (float32 for every input
// dtype but float64): a scale that overflows, or a softcap that overflows or rounds to 0, would change the result.
void check_score_options(const char* op, c10::ScalarType dtype, std::optional<double> scale, int64_t window_left,
                         int64_t window_right, double softcap);

// The pattern options of the softmax attention ops (docs/attention_api.md), as given.
struct PatternOptions {
  // Attention sinks: one logit per query head [heads_q] (float32 or q's dtype), in the units of the scaled
  // scores, added to every row's softmax denominator (exp(sinks[h])) and to nothing else.
  std::optional<at::Tensor> sinks;
  // ALiBi: float32 slopes [heads_q] or [batch, heads_q]; the score of query position p and key position j
  // gains -slope * |p - j| after soft-capping (positions bottom-right aligned, cache positions over a cache).
  std::optional<at::Tensor> alibi_slopes;
  // Chunked-local attention (C > 0): the query at position p sees only keys in its chunk
  // [floor(p / C) * C, floor(p / C) * C + C), positions as ALiBi's.
  int64_t attention_chunk = 0;
};

// The pattern options: sinks None or [heads_q] float32 / q's dtype on q's device; alibi_slopes None or float32
// [heads_q] / [batch, heads_q] on q's device, not requiring grad while grad mode is on; attention_chunk >= 0.
void check_pattern_options(const char* op, const at::Tensor& q, const c10::SymInt& batch,
                           const c10::SymInt& heads_q, const PatternOptions& patterns);

// Slopes that require grad, while grad mode is on, are refused. An autograd kernel checks before its Function
// runs the op (with grad mode off).
void check_alibi_not_differentiable(const char* op, const std::optional<at::Tensor>& alibi_slopes);

// The softmax scale: `scale` when given, else 1 / sqrt(head_dim). It guards the head dim to an integer, so only
// kernels that run call it (Meta kernels never need the scale).
double resolve_scale(std::optional<double> scale, const c10::SymInt& head_dim);

// lse's dtype: float32, or float64 for float64 inputs.
c10::ScalarType attention_lse_dtype(c10::ScalarType input_dtype);

// The output shapes of an op that returns (out, lse), and lse's dtype.
struct OutLseSizes {
  std::vector<c10::SymInt> out;
  std::vector<c10::SymInt> lse;
  c10::ScalarType lse_dtype = c10::ScalarType::Float;
};

// Empty (out, lse) of these shapes: out in the dtype of `options`, lse in lse_dtype (Meta tensors too).
std::tuple<at::Tensor, at::Tensor> empty_out_lse(const OutLseSizes& sizes, const at::TensorOptions& options);

}  // namespace attn_ops
