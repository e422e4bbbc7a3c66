// Row-major GEMM on the BLAS that libtorch_cpu carries (MKL on x86-64 wheels, OpenBLAS elsewhere).
// Called from inside at::parallel_for, where the BLAS runs single-threaded on each worker.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>

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

}  // namespace attn_ops::cpu
