// Row-major GEMM on the BLAS that libtorch_cpu carries (MKL on x86-64 wheels, OpenBLAS elsewhere).
// Called from inside at::parallel_for, where the BLAS runs single-threaded on each worker.
#pragma once

#include "common/cpu_isa.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <limits>
#include <type_traits>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}

namespace attn_ops::cpu {

inline int blas_int(int64_t v) {
  TORCH_CHECK(v <= std::numeric_limits<int>::max(), "attn_ops: BLAS dimension ", v, " exceeds the 32-bit limit");
  return static_cast<int>(v);
}

// C[m, n] = alpha * op(A) op(B) + beta * C, all row-major; op(X) is X or X^T. Row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T, so the column-major BLAS gets the operands swapped.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) {
    return;
  }
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int M = blas_int(n), N = blas_int(m), K = blas_int(k);
  // BLAS requires leading dimensions >= 1 even when k == 0.
  const int LDA = blas_int(std::max<int64_t>(ldb, 1)), LDB = blas_int(std::max<int64_t>(lda, 1)),
            LDC = blas_int(std::max<int64_t>(ldc, 1));
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&tb, &ta, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
  } else {
    static_assert(std::is_same_v<T, double>, "gemm supports float and double");
    dgemm_(&tb, &ta, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
  }
}

// Low-precision tile products in the input dtype with float32 accumulation, on PyTorch's brgemm (oneDNN's
// AMX kernels): available where the CPU runs them (could_pack: AMX for bfloat16, AMX-FP16 for float16) and
// AMX is not turned off (cpu_has_amx_bf16: ATTN_OPS_CPU_AMX=0 or a lower ATTN_OPS_CPU_ISA).
template <typename scalar_t>
bool lowp_brgemm_available() {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> || std::is_same_v<scalar_t, c10::Half>) {
    return at::native::cpublas::could_pack(c10::CppTypeToScalarType<scalar_t>::value) && cpu_has_amx_bf16();
  } else {
    return false;
  }
}

// B[k, n] (row-major, row stride ld_in; k even, n = 64) into brgemm's packed (VNNI) layout: pairs of rows
// interleaved, [k / 2, n, 2] = k * n values; a prefix of 2j rows packs into the first 2j * n values.
template <typename scalar_t>
void lowp_brgemm_pack(int64_t k, int64_t n, int64_t ld_in, const scalar_t* in, scalar_t* out) {
  const auto dtype = c10::CppTypeToScalarType<scalar_t>::value;
  at::native::cpublas::pack(k, n, ld_in, n, dtype, dtype, in, out);
}

// C[m, n] (row stride ldc, float32) = (accumulate ? C : 0) + A[m, k] B[k, n]; A row-major (row stride lda),
// B packed by lowp_brgemm_pack (ldb = its n), k even.
template <typename scalar_t>
void lowp_brgemm(int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda, const scalar_t* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c);
}

}  // namespace attn_ops::cpu
