#pragma once
// Per-row math of the losses, as AD_HD code: the CPU kernels (src/ops/loss.cpp)
// and the CUDA kernels (src/cuda/loss.cu) run the same functions. No host-only
// headers here: nvcc compiles it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/math.hpp"

namespace ad::loss {

// lse(x_r) - x_r[label]: one row's cross-entropy, in double
template <class T> AD_HD double cross_entropy_row(const T* xr, std::int64_t c, std::int64_t label) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < c; ++j) m = std::max(m, static_cast<double>(xr[j]));
  double s = 0;
  for (std::int64_t j = 0; j < c; ++j) s += static_cast<double>(math::exp_(static_cast<T>(xr[j] - m)));
  return m + std::log(s) - static_cast<double>(xr[label]);
}

// Row r of d/dlogits: (softmax(x_r) - onehot(label_r)) dy [/ rows]; dy is the
// loss's one-element gradient, read where the kernel runs.
template <class T> struct CrossEntropyDx {
  const T* x;
  const std::int64_t* labels;
  const T* dy;
  T* dx;
  std::int64_t c, rows;
  bool mean;
  AD_HD void operator()(std::int64_t r) const {
    double scale = static_cast<double>(dy[0]);
    if (mean) scale /= static_cast<double>(rows);
    const T* xr = x + r * c;
    T* dr = dx + r * c;
    T m = -std::numeric_limits<T>::infinity();
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, xr[j]);
    double s = 0;
    for (std::int64_t j = 0; j < c; ++j) { dr[j] = math::exp_(static_cast<T>(xr[j] - m)); s += static_cast<double>(dr[j]); }
    T f = static_cast<T>(scale / s);
    for (std::int64_t j = 0; j < c; ++j) dr[j] *= f;
    dr[labels[r]] -= static_cast<T>(scale);
  }
};

// (a - b)^2 in double: one term of mse's sum
template <class T> AD_HD double squared_diff(T a, T b) {
  double d = static_cast<double>(a) - b;
  return d * d;
}

}  // namespace ad::loss
