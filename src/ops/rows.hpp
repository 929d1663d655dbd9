#pragma once
// Per-row math of the ops that work along one axis (logsumexp, softmax,
// log_softmax and their backwards), as AD_HD functors over a strided row:
// f(base, stride, o) handles elements base + j * stride, j < len, and output
// o of a reduced op. The CPU kernels (src/ops/reduce.cpp) call them row by
// row; the CUDA kernels (src/cuda/rows.cu) run one row per thread — the same
// code on both. No host-only headers here: nvcc compiles it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/math.hpp"

namespace ad::rows {

template <class T> AD_HD T neg_inf() { return -std::numeric_limits<T>::infinity(); }
// max that propagates NaN (std::max(m, NaN) keeps m: a row of NaN and -inf
// then passed for an all -inf row, and logsumexp / softmax dropped the NaN)
template <class T> AD_HD T nan_max(T m, T v) { return v > m || v != v ? v : m; }

// Stable log-sum-exp of a strided row; -inf for an all -inf (or empty) row.
template <class T> AD_HD double lse(const T* x, std::int64_t base, std::int64_t stride, std::int64_t len) {
  double m = neg_inf<double>();
  for (std::int64_t j = 0; j < len; ++j) m = nan_max(m, static_cast<double>(x[base + j * stride]));
  if (!std::isfinite(m)) return m;  // all -inf row -> -inf; a +inf entry -> +inf; a NaN -> NaN
  double s = 0;
  for (std::int64_t j = 0; j < len; ++j) s += std::exp(static_cast<double>(x[base + j * stride]) - m);
  return m + std::log(s);
}

// y[o] = lse(row)
template <class T> struct Logsumexp {
  const T* x;
  T* y;
  std::int64_t len;
  AD_HD void operator()(std::int64_t base, std::int64_t stride, std::int64_t o) const {
    y[o] = static_cast<T>(lse(x, base, stride, len));
  }
};
// (x, y, dy) -> dy exp(x - y); 0 where y = -inf
template <class T> struct LogsumexpBackward {
  const T *x, *y, *dy;
  T* dx;
  std::int64_t len;
  AD_HD void operator()(std::int64_t base, std::int64_t stride, std::int64_t o) const {
    T yo = y[o], g = dy[o];
    bool dead = yo == neg_inf<T>();
    for (std::int64_t j = 0; j < len; ++j) {
      std::int64_t i = base + j * stride;
      dx[i] = dead ? T(0) : g * math::exp_(x[i] - yo);
    }
  }
};
// exp(x - max) / sum; an all -inf row gives 0
template <class T> struct Softmax {
  const T* x;
  T* y;
  std::int64_t len;
  AD_HD void operator()(std::int64_t base, std::int64_t stride, std::int64_t) const {
    T m = neg_inf<T>();
    for (std::int64_t j = 0; j < len; ++j) m = nan_max(m, x[base + j * stride]);
    if (m == neg_inf<T>()) {
      for (std::int64_t j = 0; j < len; ++j) y[base + j * stride] = T(0);
      return;
    }
    double s = 0;
    for (std::int64_t j = 0; j < len; ++j) {
      T e = math::exp_(x[base + j * stride] - m);
      y[base + j * stride] = e;
      s += static_cast<double>(e);
    }
    T inv = static_cast<T>(1.0 / s);
    for (std::int64_t j = 0; j < len; ++j) y[base + j * stride] *= inv;
  }
};
// (y, dy) -> y (dy - sum(dy y))
template <class T> struct SoftmaxBackward {
  const T *y, *dy;
  T* dx;
  std::int64_t len;
  AD_HD void operator()(std::int64_t base, std::int64_t stride, std::int64_t) const {
    double s = 0;
    for (std::int64_t j = 0; j < len; ++j) s += static_cast<double>(dy[base + j * stride]) * y[base + j * stride];
    T st = static_cast<T>(s);
    for (std::int64_t j = 0; j < len; ++j) {
      std::int64_t i = base + j * stride;
      dx[i] = y[i] * (dy[i] - st);
    }
  }
};
// x - lse; an all -inf row gives -inf
template <class T> struct LogSoftmax {
  const T* x;
  T* y;
  std::int64_t len;
  AD_HD void operator()(std::int64_t base, std::int64_t stride, std::int64_t) const {
    double l = lse(x, base, stride, len);
    bool dead = l == neg_inf<double>();
    for (std::int64_t j = 0; j < len; ++j) {
      std::int64_t i = base + j * stride;
      y[i] = dead ? neg_inf<T>() : static_cast<T>(static_cast<double>(x[i]) - l);
    }
  }
};
// (y, dy) -> dy - exp(y) sum(dy); 0 on an all -inf row
template <class T> struct LogSoftmaxBackward {
  const T *y, *dy;
  T* dx;
  std::int64_t len;
  AD_HD void operator()(std::int64_t base, std::int64_t stride, std::int64_t) const {
    double s = 0;
    bool dead = true;
    for (std::int64_t j = 0; j < len; ++j) {
      s += static_cast<double>(dy[base + j * stride]);
      dead = dead && y[base + j * stride] == neg_inf<T>();
    }
    T st = static_cast<T>(s);
    for (std::int64_t j = 0; j < len; ++j) {
      std::int64_t i = base + j * stride;
      dx[i] = dead ? T(0) : dy[i] - math::exp_(y[i]) * st;
    }
  }
};

// Which row functor a CUDA launch runs (src/cuda/rows.cu).
enum class Op { logsumexp, logsumexp_backward, softmax, softmax_backward, log_softmax, log_softmax_backward };

#define AD_ROWS_LIST(X) X(Logsumexp) X(LogsumexpBackward) X(Softmax) X(SoftmaxBackward) X(LogSoftmax) X(LogSoftmaxBackward)

}  // namespace ad::rows
