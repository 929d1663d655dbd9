#pragma once
// Per-row math of layer_norm and rms_norm over the last dim D, as AD_HD code:
// the CPU kernels (src/ops/norm.cpp) and the CUDA kernels (src/cuda/norm.cu)
// run the same functions, row r being elements r * D .. r * D + D - 1. Row
// statistics accumulate in double. No host-only headers here: nvcc compiles it.
#include <cmath>
#include <cstdint>

#include "ad/hd.hpp"

namespace ad::norm {

// mean and 1 / sqrt(variance + eps) of one row
template <class T> AD_HD void row_stats(const T* x, std::int64_t d, double eps, double& mu, double& rstd) {
  double s = 0;
  for (std::int64_t j = 0; j < d; ++j) s += x[j];
  mu = s / static_cast<double>(d);
  double v = 0;
  for (std::int64_t j = 0; j < d; ++j) { double c = x[j] - mu; v += c * c; }
  rstd = 1.0 / std::sqrt(v / static_cast<double>(d) + eps);
}
// 1 / sqrt(mean(x^2) + eps) of one row
template <class T> AD_HD double row_rms(const T* x, std::int64_t d, double eps) {
  double s = 0;
  for (std::int64_t j = 0; j < d; ++j) s += static_cast<double>(x[j]) * x[j];
  return 1.0 / std::sqrt(s / static_cast<double>(d) + eps);
}

// y = (x - mu) rstd gamma + beta, row r
template <class T> struct LayerNorm {
  const T *x, *g, *b;
  T* y;
  std::int64_t d;
  double eps;
  AD_HD void operator()(std::int64_t r) const {
    double mu, rstd;
    row_stats(x + r * d, d, eps, mu, rstd);
    T m = static_cast<T>(mu), s = static_cast<T>(rstd);
    for (std::int64_t j = 0; j < d; ++j) y[r * d + j] = (x[r * d + j] - m) * s * g[j] + b[j];
  }
};
// xh = (x - mu) rstd, gd = dy gamma: dx = rstd (gd - mean(gd) - xh mean(gd xh)), row r
template <class T> struct LayerNormDx {
  const T *x, *g, *dy;
  T* dx;
  std::int64_t d;
  double eps;
  AD_HD void operator()(std::int64_t r) const {
    const T *xr = x + r * d, *dyr = dy + r * d;
    double mu, rstd;
    row_stats(xr, d, eps, mu, rstd);
    double s1 = 0, s2 = 0;
    for (std::int64_t j = 0; j < d; ++j) {
      double gd = static_cast<double>(dyr[j]) * g[j];
      s1 += gd;
      s2 += gd * (xr[j] - mu) * rstd;
    }
    double m1 = s1 / static_cast<double>(d), m2 = s2 / static_cast<double>(d);
    for (std::int64_t j = 0; j < d; ++j) {
      double xh = (xr[j] - mu) * rstd;
      dx[r * d + j] = static_cast<T>(rstd * (static_cast<double>(dyr[j]) * g[j] - m1 - xh * m2));
    }
  }
};
// One row's term of dgamma[j] = sum_rows dy xh (summed over rows in order, in T)
template <class T> AD_HD T layer_norm_dgamma_term(T x, T dy, double mu, double rstd) {
  return dy * static_cast<T>((x - mu) * rstd);
}

// y = x r gamma, r = 1 / sqrt(mean(x^2) + eps), row r
template <class T> struct RmsNorm {
  const T *x, *g;
  T* y;
  std::int64_t d;
  double eps;
  AD_HD void operator()(std::int64_t r) const {
    T s = static_cast<T>(row_rms(x + r * d, d, eps));
    for (std::int64_t j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] * s * g[j];
  }
};
// gd = dy gamma: dx = r (gd - x r^2 mean(gd x)), row r
template <class T> struct RmsNormDx {
  const T *x, *g, *dy;
  T* dx;
  std::int64_t d;
  double eps;
  AD_HD void operator()(std::int64_t r) const {
    const T *xr = x + r * d, *dyr = dy + r * d;
    double rs = row_rms(xr, d, eps);
    double s = 0;
    for (std::int64_t j = 0; j < d; ++j) s += static_cast<double>(dyr[j]) * g[j] * xr[j];
    double m = s / static_cast<double>(d);
    for (std::int64_t j = 0; j < d; ++j)
      dx[r * d + j] = static_cast<T>(rs * (static_cast<double>(dyr[j]) * g[j] - xr[j] * rs * rs * m));
  }
};
// One row's term of dgamma[j] = sum_rows dy x r (summed over rows in order, in T)
template <class T> AD_HD T rms_norm_dgamma_term(T x, T dy, double rs) { return dy * static_cast<T>(x * rs); }

}  // namespace ad::norm
