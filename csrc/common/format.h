// Small helpers that render tensors' properties for error messages, so every check reads the same.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymIntArrayRef.h>

#include <sstream>
#include <string>

namespace attn_ops {

// The dtype as Python spells it: "float32", "bfloat16", "int64".
inline std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    case c10::ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case c10::ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    default: return c10::toString(t);
  }
}

// "[2, 5, 64]"; symbolic sizes print as their expressions.
inline std::string shape_str(c10::SymIntArrayRef sizes) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    os << (i ? ", " : "") << sizes[i];
  }
  os << "]";
  return os.str();
}

inline std::string shape_str(const at::Tensor& t) {
  return shape_str(t.sym_sizes());
}

}  // namespace attn_ops
