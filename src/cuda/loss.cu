// CUDA kernels of the losses: cross_entropy (one thread per row, the row
// function of ops/loss_math.hpp), its backward, and mse. The scalar results
// are sums of f64 terms in a fixed order: partial sums into the op's
// workspace, then one block adds them up (deterministic, no atomics).
#include <cuda_runtime.h>

#include "cuda/launch.hpp"
#include "cuda/util.cuh"
#include "ops/loss_math.hpp"

namespace ad::cuda_k {

namespace {
constexpr int kThreads = 256;

template <class T> struct CrossEntropyRows {
  const T* x;
  const std::int64_t* labels;
  std::int64_t c;
  double* parts;
  __device__ void operator()(std::int64_t r) const { parts[r] = loss::cross_entropy_row(x + r * c, c, labels[r]); }
};

// Fixed-order sum of the kThreads values in s (every thread of the block calls it).
__device__ double block_sum(double* s) {
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  return s[0];
}
// One block: y[0] = (sum of parts) / divisor.
template <class T> __global__ void sum_parts_kernel(const double* parts, std::int64_t n, double divisor, T* y) {
  __shared__ double s[kThreads];
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += kThreads) acc += parts[i];
  s[threadIdx.x] = acc;
  __syncthreads();
  double total = block_sum(s);
  if (threadIdx.x == 0) y[0] = static_cast<T>(total / divisor);
}
// Block b writes parts[b] = sum of (a - b)^2 over its grid-stride share.
template <class T> __global__ void mse_kernel(const T* a, const T* b, std::int64_t n, double* parts) {
  __shared__ double s[kThreads];
  double acc = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads)
    acc += loss::squared_diff(a[i], b[i]);
  s[threadIdx.x] = acc;
  __syncthreads();
  double total = block_sum(s);
  if (threadIdx.x == 0) parts[blockIdx.x] = total;
}

template <class T> void sum_parts(const double* parts, std::int64_t n, double divisor, void* y, const char* what) {
  sum_parts_kernel<<<1, kThreads>>>(parts, n, divisor, static_cast<T*>(y));
  check_launch(what);
}
}  // namespace

void cross_entropy(DType t, const void* x, const std::int64_t* labels, std::int64_t rows, std::int64_t c,
                   double divisor, double* parts, void* y) {
  if (t == DType::f32) {
    for_each_index(CrossEntropyRows<float>{static_cast<const float*>(x), labels, c, parts}, rows, "cross_entropy");
    sum_parts<float>(parts, rows, divisor, y, "cross_entropy (sum)");
  } else {
    for_each_index(CrossEntropyRows<double>{static_cast<const double*>(x), labels, c, parts}, rows, "cross_entropy");
    sum_parts<double>(parts, rows, divisor, y, "cross_entropy (sum)");
  }
}

void cross_entropy_backward(DType t, const void* x, const std::int64_t* labels, const void* dy, void* dx,
                            std::int64_t rows, std::int64_t c, bool mean) {
  if (t == DType::f32)
    for_each_index(loss::CrossEntropyDx<float>{static_cast<const float*>(x), labels, static_cast<const float*>(dy),
                                               static_cast<float*>(dx), c, rows, mean},
                   rows, "cross_entropy_backward");
  else
    for_each_index(loss::CrossEntropyDx<double>{static_cast<const double*>(x), labels, static_cast<const double*>(dy),
                                                static_cast<double*>(dx), c, rows, mean},
                   rows, "cross_entropy_backward");
}

void mse(DType t, const void* a, const void* b, std::int64_t n, double divisor, double* parts, std::int64_t nparts,
         void* y) {
  auto blocks = static_cast<unsigned>(nparts);
  if (t == DType::f32) {
    mse_kernel<<<blocks, kThreads>>>(static_cast<const float*>(a), static_cast<const float*>(b), n, parts);
    check_launch("mse");
    sum_parts<float>(parts, nparts, divisor, y, "mse (sum)");
  } else {
    mse_kernel<<<blocks, kThreads>>>(static_cast<const double*>(a), static_cast<const double*>(b), n, parts);
    check_launch("mse");
    sum_parts<double>(parts, nparts, divisor, y, "mse (sum)");
  }
}

}  // namespace ad::cuda_k
