#pragma once
// Internal: the CUDA kernels' launchers, as plain functions over raw device
// pointers and sizes (no CUDA or fmt headers: the op files, compiled by the
// host compiler, call them from their *_cuda glue). Everything is queued on
// the current device's default stream.
#include <cstdint>

#include "ad/dtype.hpp"
#include "ad/shape.hpp"
#include "ops/pointwise.hpp"
#include "ops/rows.hpp"

#include <initializer_list>

namespace ad::cuda_k {

// ---- pointwise (src/cuda/pointwise.cu) ----
// y[i] = f(x[i]); t is f32 or f64.
template <class F> void map1(DType t, const void* x, void* y, std::int64_t n, F f);
// y[i] = f(a[i], b[i]), same shapes.
template <class F> void map2(DType t, const void* a, const void* b, void* y, std::int64_t n, F f);
// y = f(a, b) with numpy broadcasting of a (shape as) and b (bs) to ys.
template <class F>
void broadcast2(DType t, const void* a, const Shape& as, const void* b, const Shape& bs, void* y, const Shape& ys, F f);
// y = x converted between any of f32, f64, f16, bf16.
void cast(DType from, DType to, const void* x, void* y, std::int64_t n);
// dst += src.
void add_into(DType t, void* dst, const void* src, std::int64_t n);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- cuBLAS (src/cuda/blas.cpp) ----
// Row-major C_i = op(A_i) op(B_i) for i < batch, op = transpose when ta/tb;
// A_i = a + i * stride_a (stride 0: the same matrix for every i), likewise B
// and C. f32 or f64. K = 0 gives zeros.
void gemm(DType t, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
          const void* a, std::int64_t stride_a, const void* b, std::int64_t stride_b, void* c, std::int64_t stride_c);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- reductions (src/cuda/reduce.cu) ----
// y = scale * sum of x over the dims where `keep` (same rank as xs) is 1 and
// xs is not; y is laid out as `keep`. Accumulates in f64, in a fixed order.
void reduce_sum(DType t, const void* x, const Shape& xs, const Shape& keep, void* y, double scale);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- along one axis (src/cuda/rows.cu) ----
// Rows of a tensor viewed as (outer, len, inner): row (o, i) holds elements
// o * len * inner + i + j * inner, j < len.
struct RowGeom {
  std::int64_t outer, len, inner;
};
// Runs the row functor `op` of ops/rows.hpp on every row, one row per thread:
// `in` are its input pointers in the functor's order, `out` its output.
void for_rows(DType t, RowGeom g, rows::Op op, std::initializer_list<const void*> in, void* out);

}  // namespace ad::cuda_k
