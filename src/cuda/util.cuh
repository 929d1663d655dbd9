#pragma once
// Internal helpers of the .cu files: launch sizes, launch checks, and a
// one-thread-per-row kernel. (check.hpp pulls in fmt, which nvcc cannot
// compile in C++20: errors here are built with std::string.)
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ad/error.hpp"
#include "core/device.hpp"

namespace ad::cuda_k {

// Blocks for a grid-stride loop over n items, capped (the loops cover the rest).
inline unsigned grid_for(std::int64_t n, int threads) {
  std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b < 65535L * 16 ? b : 65535L * 16));
}
inline void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(e));
}
// A failed call also leaves its error as the thread's last error: cleared here, so that the next launch's
// check_launch does not report it again as its own (it once named the next op's kernel).
inline void check_call(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
  }
}

// f(r) for every r < n, one thread each.
template <class F> __global__ void each_kernel(F f, std::int64_t n) {
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    f(r);
}
template <class F> void for_each_index(F f, std::int64_t n, const char* what) {
  if (n <= 0) return;
  constexpr int kRowThreads = 128;
  each_kernel<<<grid_for(n, kRowThreads), kRowThreads>>>(f, n);
  check_launch(what);
}

// A kernel's answer to the host (the first bad position, say): 8 bytes from
// the caching pool of the current device, set to `init` (0xff bytes: all
// ones) before any kernel of the default stream that follows, returned on
// scope exit. One per call, so calls on several threads never share one.
struct Flag {
  int dev = 0;
  unsigned long long* p = nullptr;
  explicit Flag(int init_byte = 0xff) {
    check_call(cudaGetDevice(&dev), "cudaGetDevice");
    p = static_cast<unsigned long long*>(cuda_rt::allocate(dev, sizeof(unsigned long long)));
    const cudaError_t e = cudaMemsetAsync(p, init_byte, sizeof(unsigned long long), 0);
    if (e != cudaSuccess) {
      cuda_rt::deallocate(dev, p, sizeof(unsigned long long));
      check_call(e, "cudaMemsetAsync (flag)");
    }
  }
  ~Flag() { cuda_rt::deallocate(dev, p, sizeof(unsigned long long)); }
  Flag(const Flag&) = delete;
  Flag& operator=(const Flag&) = delete;
  // the value, once the kernels queued before on the default stream are done
  unsigned long long get() const {
    unsigned long long v = 0;
    check_call(cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost), "cudaMemcpy (flag)");
    return v;
  }
};

}  // namespace ad::cuda_k
