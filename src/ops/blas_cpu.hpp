#pragma once
// Internal: row-major GEMM through OpenBLAS for the CPU kernels (matmul,
// conv2d).
#include <cblas.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/graph_impl.hpp"

namespace ad::blas {

inline void check_int(const char* op, std::int64_t v) {
  if (v > INT_MAX) kernel_fail(op, fmt::format("dimension {} exceeds the BLAS integer range", v));
}

// C = op(A) op(B) + beta C, all contiguous: A is [m,k] ([k,m] when ta), B
// [k,n] ([n,k] when tb), C [m,n]. k = 0 gives beta C. T is float or double.
template <class T>
void gemm(const char* op, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b,
          T* c, T beta = T(0)) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == T(0)) std::memset(c, 0, static_cast<std::size_t>(m * n) * sizeof(T));
    else
      for (std::int64_t i = 0; i < m * n; ++i) c[i] *= beta;
    return;
  }
  check_int(op, m); check_int(op, n); check_int(op, k);
  auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n), ldc = static_cast<int>(n);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, lda, b,
                ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, TA, TB, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a, lda, b,
                ldb, beta, c, ldc);
}

}  // namespace ad::blas
