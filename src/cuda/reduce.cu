// Sum reductions on the GPU (sum, mean, sum_to): one block per output
// element; its threads stride over the reduced elements, accumulate in f64
// and combine in shared memory in a fixed tree order (deterministic).
#include <cuda_runtime.h>

#include <string>

#include "ad/error.hpp"
#include "cuda/launch.hpp"

namespace ad::cuda_k {

namespace {
constexpr int kThreads = 256;
struct Geom {
  int rank;
  std::int64_t keep[kMaxRank];  // output dims (1 where reduced)
  std::int64_t red[kMaxRank];   // reduced dims (1 where kept)
  std::int64_t stride[kMaxRank];
  std::int64_t nred;
};
template <class T> __global__ void reduce_kernel(const T* x, T* y, std::int64_t nout, Geom g, double scale) {
  __shared__ double part[kThreads];
  for (std::int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
    std::int64_t rem = o, base = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      base += (rem % g.keep[d]) * g.stride[d];
      rem /= g.keep[d];
    }
    double acc = 0;
    for (std::int64_t r = threadIdx.x; r < g.nred; r += blockDim.x) {
      std::int64_t rr = r, off = base;
      for (int d = g.rank - 1; d >= 0; --d) {
        off += (rr % g.red[d]) * g.stride[d];
        rr /= g.red[d];
      }
      acc += static_cast<double>(x[off]);
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
      if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) y[o] = static_cast<T>(part[0] * scale);
    __syncthreads();
  }
}
}  // namespace

void reduce_sum(DType t, const void* x, const Shape& xs, const Shape& keep, void* y, double scale) {
  std::int64_t nout = keep.numel();
  if (nout == 0) return;
  Geom g{};
  g.rank = xs.rank();
  g.nred = 1;
  std::int64_t acc = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.stride[d] = acc;
    acc *= xs[d];
    bool reduced = keep[d] == 1 && xs[d] != 1;
    g.keep[d] = reduced ? 1 : xs[d];
    g.red[d] = reduced ? xs[d] : 1;
    g.nred *= g.red[d];
  }
  auto blocks = static_cast<unsigned>(nout < 65535L * 16 ? nout : 65535L * 16);
  if (t == DType::f32)
    reduce_kernel<<<blocks, kThreads>>>(static_cast<const float*>(x), static_cast<float*>(y), nout, g, scale);
  else
    reduce_kernel<<<blocks, kThreads>>>(static_cast<const double*>(x), static_cast<double*>(y), nout, g, scale);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("CUDA kernel reduce_sum: ") + cudaGetErrorString(e));
}

}  // namespace ad::cuda_k
