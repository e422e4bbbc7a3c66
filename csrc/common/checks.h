// Argument checks that every op family shares, each throwing a message that names the op, the argument,
// what was expected and what came.
#pragma once

#include "common/format.h"

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <optional>

namespace attn_ops {

// Whether a check may read the values of `t` on the host. Not those of meta and fake tensors (torch.compile
// tracing), and not those of a CUDA tensor: reading them means a copy to the host, a synchronisation; the
// CUDA kernels check them on the device instead (common/cuda/index_checks.h; skipped under CUDA-graph
// capture, where every kernel still bounds-checks the indices it reads, docs/cuda.md).
bool can_read_values(const at::Tensor& t);

// A size hint of the schema (max_seqlen*, SymInt? so that torch.compile keeps it symbolic instead of
// compiling a graph per value) as the preparation reads it: its value, or, when symbolic (fake tensors while
// tracing with dynamic shapes), not given. A Meta kernel reads no value; the CPU / CUDA kernels that run the
// compiled graph get the concrete value and check it.
inline std::optional<int64_t> size_hint(const std::optional<c10::SymInt>& hint) {
  return hint.has_value() ? hint->maybe_as_int() : std::nullopt;
}

inline bool is_float_dtype(c10::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

inline void check_float_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(is_float_dtype(t.scalar_type()), op, ": ", name, " must be float16, bfloat16, float32 or float64, got ",
              dtype_name(t.scalar_type()));
}

// `t` has the dtype and device of `ref` (named `ref_name`).
inline void check_same_dtype_device(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                                    const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the same dtype as ", ref_name, " (",
              dtype_name(ref.scalar_type()), "), got ", dtype_name(t.scalar_type()));
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the same device as ", ref_name, " (",
              ref.device(), "), got ", t.device());
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                              const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the same device as ", ref_name, " (",
              ref.device(), "), got ", t.device());
}

inline void check_last_dim_contiguous(const char* op, const char* name, const at::Tensor& t) {
  // A last dim of size 1 may carry any stride; it is still read contiguously. So may an empty tensor (nothing is
  // read): the gradient of out.sum() over no element arrives expanded, with stride 0, and stays so through
  // .contiguous(), which sees nothing to copy.
  TORCH_CHECK(t.sym_stride(-1) == 1 || t.sym_size(-1) == 1 || t.sym_numel() == 0, op, ": ", name,
              " must have stride 1 in its last dimension, got stride ", t.sym_stride(-1));
}

// `t` has `dim` dimensions, described by `dims` ("[batch, seqlen, heads, head_dim]"); `when` is appended to
// the expectation (e.g. " when block_table is given").
inline void check_rank(const char* op, const char* name, const at::Tensor& t, int64_t dim, const char* dims,
                       const char* when = "") {
  TORCH_CHECK(t.dim() == dim, op, ": ", name, " must be a ", dim, "-D tensor ", dims, when, ", got a ", t.dim(),
              "-D tensor of shape ", shape_str(t));
}

// An index tensor: int32 (or int64 where allowed) of the expected shape; `shape_ok` says whether its shape is
// that one, and shape_text() describes it. shape_text is called only to build the message: formatting the
// (symbolic) sizes on every call would cost each decode step a few string streams.
template <typename ShapeText>
void check_index_tensor(const char* op, const char* name, const at::Tensor& t, bool allow_int64, bool shape_ok,
                        const ShapeText& shape_text) {
  const bool dtype_ok = t.scalar_type() == at::kInt || (allow_int64 && t.scalar_type() == at::kLong);
  TORCH_CHECK(dtype_ok && shape_ok, op, ": ", name, " must be an ", allow_int64 ? "int32 or int64" : "int32",
              " tensor of shape ", shape_text(), ", got ", dtype_name(t.scalar_type()), " tensor of shape ",
              shape_str(t));
}

// A tensor argument and its name in the schema, for checks that look at several arguments at once.
struct NamedTensor {
  const char* name;
  const at::Tensor& tensor;
};

// The tensor `name` that an in-place op writes: no two of its elements may share memory (a dimension of
// stride 0, as expand() makes; checked on Meta too, from the strides), and, except on Meta (no memory to
// compare), it may not overlap any of `others` (the op's other arguments), as PyTorch's own in-place ops
// require, nor be an inference tensor outside torch.inference_mode().
void check_in_place_target(const char* op, const NamedTensor& target, std::initializer_list<NamedTensor> others);

// All of `tensors` are on one device; otherwise the message lists every argument's device, so the odd one
// out is plain to see.
void check_one_device(const char* op, std::initializer_list<NamedTensor> tensors);

}  // namespace attn_ops
