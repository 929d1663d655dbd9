// CUDA kernels of conv2d and max_pool2d: im2col and its adjoint col2im (a
// gather, one thread per dx element: no atomics, deterministic), the
// windows' maxima and their gradient. One thread per output element, the
// index math of ops/conv_math.hpp (the CPU kernels run the same functions);
// the products are cuBLAS calls made by src/ops/conv.cpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch.hpp"
#include "cuda/util.cuh"
#include "ops/conv_math.hpp"

namespace ad::cuda_k {

namespace {
constexpr int kThreads = 256;

// cols[b][r][l] for images n0 + b, b < cnt
template <class T>
__global__ void im2col_kernel(conv::Geom g, const T* x, std::int64_t n0, std::int64_t cnt, T* cols) {
  const std::int64_t per = g.cols_elems(), total = per * cnt, L = g.l();
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = e / per, rl = e % per;
    cols[e] = conv::im2col_at(g, x + (n0 + b) * g.c * g.plane(), rl / L, rl % L);
  }
}
template <class T> __global__ void col2im_kernel(conv::Geom g, const T* cols, std::int64_t cnt, T* dx) {
  const std::int64_t img = g.c * g.plane(), total = img * cnt;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = e / img, r = e % img;
    const std::int64_t c = r / g.plane(), y = (r / g.w) % g.h, x = r % g.w;
    dx[e] = conv::col2im_at(g, cols + b * g.cols_elems(), c, y, x);
  }
}
template <class T> __global__ void max_pool_kernel(conv::Geom g, const T* x, T* y) {
  const std::int64_t L = g.l(), total = g.n * g.c * L;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t p = e / L, l = e % L;
    y[e] = conv::max_pool_at(g, x + p * g.plane(), l / g.wo, l % g.wo);
  }
}
template <class T> __global__ void max_pool_backward_kernel(conv::Geom g, const T* x, const T* dy, T* dx) {
  const std::int64_t P = g.plane(), total = g.n * g.c * P;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t p = e / P, r = e % P;
    dx[e] = conv::max_pool_grad_at(g, x + p * P, dy + p * g.l(), r / g.w, r % g.w);
  }
}

template <class F> void by_float(DType t, const char* what, F f) {
  if (t == DType::f32) return f(float{});
  if (t == DType::f64) return f(double{});
  throw Error(std::string(what) + ": no CUDA kernel for this dtype (f32 or f64)");
}
}  // namespace

void im2col(DType t, const conv::Geom& g, const void* x, std::int64_t n0, std::int64_t cnt, void* cols) {
  const std::int64_t total = g.cols_elems() * cnt;
  if (total == 0) return;
  by_float(t, "conv2d", [&](auto v) {
    using T = decltype(v);
    im2col_kernel<<<grid_for(total, kThreads), kThreads>>>(g, static_cast<const T*>(x), n0, cnt, static_cast<T*>(cols));
  });
  check_launch("im2col");
}

void col2im(DType t, const conv::Geom& g, const void* cols, std::int64_t cnt, void* dx) {
  const std::int64_t total = g.c * g.plane() * cnt;
  if (total == 0) return;
  by_float(t, "conv2d_backward_input", [&](auto v) {
    using T = decltype(v);
    col2im_kernel<<<grid_for(total, kThreads), kThreads>>>(g, static_cast<const T*>(cols), cnt, static_cast<T*>(dx));
  });
  check_launch("col2im");
}

void max_pool2d(DType t, const conv::Geom& g, const void* x, void* y) {
  const std::int64_t total = g.n * g.c * g.l();
  if (total == 0) return;
  by_float(t, "max_pool2d", [&](auto v) {
    using T = decltype(v);
    max_pool_kernel<<<grid_for(total, kThreads), kThreads>>>(g, static_cast<const T*>(x), static_cast<T*>(y));
  });
  check_launch("max_pool2d");
}

void max_pool2d_backward(DType t, const conv::Geom& g, const void* x, const void* dy, void* dx) {
  const std::int64_t total = g.n * g.c * g.plane();
  if (total == 0) return;
  by_float(t, "max_pool2d_backward", [&](auto v) {
    using T = decltype(v);
    max_pool_backward_kernel<<<grid_for(total, kThreads), kThreads>>>(g, static_cast<const T*>(x),
                                                                       static_cast<const T*>(dy), static_cast<T*>(dx));
  });
  check_launch("max_pool2d_backward");
}

}  // namespace ad::cuda_k
