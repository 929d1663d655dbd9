// CUDA kernels of layer_norm and rms_norm: one thread per row running the row
// functors of ops/norm_math.hpp that the CPU kernels run too. dgamma sums a
// column over all rows, so its kernels first store each row's statistics
// (the op's workspace), then run one thread per column adding the rows in
// order, as the CPU does.
#include <cuda_runtime.h>

#include "cuda/launch.hpp"
#include "cuda/util.cuh"
#include "ops/norm_math.hpp"

namespace ad::cuda_k {

namespace {
template <class T> struct LayerNormStats {
  const T* x;
  std::int64_t d;
  double eps;
  double *mu, *rstd;
  __device__ void operator()(std::int64_t r) const { norm::row_stats(x + r * d, d, eps, mu[r], rstd[r]); }
};
template <class T> struct LayerNormDgamma {
  const T *x, *dy;
  const double *mu, *rstd;
  T* out;
  std::int64_t rows, d;
  __device__ void operator()(std::int64_t j) const {
    T acc = T(0);
    for (std::int64_t r = 0; r < rows; ++r) acc += norm::layer_norm_dgamma_term(x[r * d + j], dy[r * d + j], mu[r], rstd[r]);
    out[j] = acc;
  }
};
template <class T> struct RmsNormStats {
  const T* x;
  std::int64_t d;
  double eps;
  double* rs;
  __device__ void operator()(std::int64_t r) const { rs[r] = norm::row_rms(x + r * d, d, eps); }
};
template <class T> struct RmsNormDgamma {
  const T *x, *dy;
  const double* rs;
  T* out;
  std::int64_t rows, d;
  __device__ void operator()(std::int64_t j) const {
    T acc = T(0);
    for (std::int64_t r = 0; r < rows; ++r) acc += norm::rms_norm_dgamma_term(x[r * d + j], dy[r * d + j], rs[r]);
    out[j] = acc;
  }
};

template <class T>
void layer_norm_t(const void* x, const void* g, const void* b, void* y, std::int64_t rows, std::int64_t d, double eps) {
  for_each_index(norm::LayerNorm<T>{static_cast<const T*>(x), static_cast<const T*>(g), static_cast<const T*>(b),
                                    static_cast<T*>(y), d, eps},
                 rows, "layer_norm");
}
template <class T>
void layer_norm_backward_t(int which, const void* x, const void* g, const void* dy, void* out, std::int64_t rows,
                           std::int64_t d, double eps, double* stats) {
  auto xt = static_cast<const T*>(x), dyt = static_cast<const T*>(dy);
  if (which == 0) {
    for_each_index(norm::LayerNormDx<T>{xt, static_cast<const T*>(g), dyt, static_cast<T*>(out), d, eps}, rows,
                   "layer_norm_backward");
    return;
  }
  double *mu = stats, *rstd = stats + rows;
  for_each_index(LayerNormStats<T>{xt, d, eps, mu, rstd}, rows, "layer_norm_backward (row statistics)");
  for_each_index(LayerNormDgamma<T>{xt, dyt, mu, rstd, static_cast<T*>(out), rows, d}, d, "layer_norm_backward (dgamma)");
}
template <class T>
void rms_norm_backward_t(int which, const void* x, const void* g, const void* dy, void* out, std::int64_t rows,
                         std::int64_t d, double eps, double* stats) {
  auto xt = static_cast<const T*>(x), dyt = static_cast<const T*>(dy);
  if (which == 0) {
    for_each_index(norm::RmsNormDx<T>{xt, static_cast<const T*>(g), dyt, static_cast<T*>(out), d, eps}, rows,
                   "rms_norm_backward");
    return;
  }
  for_each_index(RmsNormStats<T>{xt, d, eps, stats}, rows, "rms_norm_backward (row statistics)");
  for_each_index(RmsNormDgamma<T>{xt, dyt, stats, static_cast<T*>(out), rows, d}, d, "rms_norm_backward (dgamma)");
}
}  // namespace

void layer_norm(DType t, const void* x, const void* g, const void* b, void* y, std::int64_t rows, std::int64_t d,
                double eps) {
  if (t == DType::f32) layer_norm_t<float>(x, g, b, y, rows, d, eps);
  else layer_norm_t<double>(x, g, b, y, rows, d, eps);
}
void layer_norm_backward(DType t, int which, const void* x, const void* g, const void* dy, void* out,
                         std::int64_t rows, std::int64_t d, double eps, double* stats) {
  if (t == DType::f32) layer_norm_backward_t<float>(which, x, g, dy, out, rows, d, eps, stats);
  else layer_norm_backward_t<double>(which, x, g, dy, out, rows, d, eps, stats);
}
void rms_norm(DType t, const void* x, const void* g, void* y, std::int64_t rows, std::int64_t d, double eps) {
  if (t == DType::f32)
    for_each_index(norm::RmsNorm<float>{static_cast<const float*>(x), static_cast<const float*>(g),
                                        static_cast<float*>(y), d, eps},
                   rows, "rms_norm");
  else
    for_each_index(norm::RmsNorm<double>{static_cast<const double*>(x), static_cast<const double*>(g),
                                         static_cast<double*>(y), d, eps},
                   rows, "rms_norm");
}
void rms_norm_backward(DType t, int which, const void* x, const void* g, const void* dy, void* out,
                       std::int64_t rows, std::int64_t d, double eps, double* stats) {
  if (t == DType::f32) rms_norm_backward_t<float>(which, x, g, dy, out, rows, d, eps, stats);
  else rms_norm_backward_t<double>(which, x, g, dy, out, rows, d, eps, stats);
}

}  // namespace ad::cuda_k
