// Matrix products on the GPU through cuBLAS: one handle per device, strided
// batched GEMM for every matmul (a batch of 1 is a plain GEMM).
#include <climits>
#include <mutex>

#include "cuda/check.hpp"
#include "cuda/launch.hpp"

namespace ad::cuda_k {

namespace {
cublasHandle_t handle() {
  constexpr int kMaxDevices = 64;
  static cublasHandle_t handles[kMaxDevices] = {};
  static std::mutex m;
  int dev = 0;
  AD_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(m);
  if (!handles[dev]) {
    AD_CUBLAS_CHECK(cublasCreate(&handles[dev]));
    // exact f32 products: no TF32 tensor-core shortcut unless asked for
    AD_CUBLAS_CHECK(cublasSetMathMode(handles[dev], CUBLAS_DEFAULT_MATH));
  }
  return handles[dev];
}
int as_int(std::int64_t v) {
  if (v > INT_MAX) throw Error(fmt::format("cuBLAS: dimension {} exceeds its integer range", v));
  return static_cast<int>(v);
}
}  // namespace

// cuBLAS is column-major: row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T, i.e. the same call with A and B swapped.
void gemm(DType t, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
          const void* a, std::int64_t stride_a, const void* b, std::int64_t stride_b, void* c, std::int64_t stride_c,
          bool accumulate) {
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0 && accumulate) return;
  if (k == 0) {  // zeros: each C_i's m n elements, stride_c apart (there may be gaps between them)
    const std::size_t es = dtype_size(t), width = static_cast<std::size_t>(m * n) * es;
    if (stride_c == m * n || batch == 1)
      AD_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<std::size_t>(batch) * width, 0));
    else
      AD_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<std::size_t>(stride_c) * es, 0, width,
                                      static_cast<std::size_t>(batch), 0));
    return;
  }
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  int lda = as_int(ta ? m : k), ldb = as_int(tb ? k : n), ldc = as_int(n);
  int M = as_int(m), N = as_int(n), K = as_int(k), B = as_int(batch);
  if (t == DType::f32) {
    const float one = 1, beta = accumulate ? 1.0f : 0.0f;
    AD_CUBLAS_CHECK(cublasSgemmStridedBatched(handle(), opb, opa, N, M, K, &one, static_cast<const float*>(b), ldb,
                                              stride_b, static_cast<const float*>(a), lda, stride_a, &beta,
                                              static_cast<float*>(c), ldc, stride_c, B));
  } else {
    const double one = 1, beta = accumulate ? 1.0 : 0.0;
    AD_CUBLAS_CHECK(cublasDgemmStridedBatched(handle(), opb, opa, N, M, K, &one, static_cast<const double*>(b), ldb,
                                              stride_b, static_cast<const double*>(a), lda, stride_a, &beta,
                                              static_cast<double*>(c), ldc, stride_c, B));
  }
}

}  // namespace ad::cuda_k
