// The semi-Markov CRF's hot loops: windowed max and exp-sums over two
// contiguous arrays (a ring column and a column of D). Each runs in W =
// 64 / sizeof(T) independent lanes (one AVX-512 register, two AVX2 ones) and
// combines the lanes in a fixed order, so the result does not depend on the
// instruction set. With GCC on x86-64 the functions are compiled for
// x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the baseline, picked at load
// time (target_clones); the default build has no -march flag.
#include <cstdint>
#include <limits>

#include "ops/semicrf_cpu.hpp"
#include "ops/semicrf_math.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(AD_NO_TARGET_CLONES)
#define AD_SEMICRF_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AD_SEMICRF_CLONES
#endif

namespace ad::semicrf::detail {

namespace {
template <class E> constexpr int kW = static_cast<int>(64 / sizeof(E));

template <class E>
[[gnu::always_inline]] inline E max_body(const E* __restrict a, const E* __restrict d, std::int64_t n) {
  constexpr int W = kW<E>;
  const E ninf = -std::numeric_limits<E>::infinity();
  E m[W];
  for (int l = 0; l < W; ++l) m[l] = ninf;
  std::int64_t i = 0;
  for (; i + W <= n; i += W)
    for (int l = 0; l < W; ++l) {
      E v = a[i + l] + d[i + l];
      m[l] = sel(v > m[l], v, m[l]);
    }
  E r = ninf;
  for (; i < n; ++i) {
    E v = a[i] + d[i];
    r = sel(v > r, v, r);
  }
  for (int l = 0; l < W; ++l) r = sel(m[l] > r, m[l], r);
  return r;
}

template <class E>
[[gnu::always_inline]] inline double sum_body(const E* __restrict a, const E* __restrict d, std::int64_t n, E shift) {
  constexpr int W = kW<E>;
  E s[W];
  for (int l = 0; l < W; ++l) s[l] = E(0);
  std::int64_t i = 0;
  for (; i + W <= n; i += W)
    for (int l = 0; l < W; ++l) s[l] += exp_win(static_cast<E>(a[i + l] + d[i + l]) - shift);
  double r = 0;
  for (; i < n; ++i) r += static_cast<double>(exp_win(static_cast<E>(a[i] + d[i]) - shift));
  for (int l = 0; l < W; ++l) r += static_cast<double>(s[l]);
  return r;
}

template <class E>
[[gnu::always_inline]] inline double sum_grad_body(const E* __restrict a, const E* __restrict d, std::int64_t n,
                                                    E shift, E f, E* __restrict dd) {
  constexpr int W = kW<E>;
  E s[W];
  for (int l = 0; l < W; ++l) s[l] = E(0);
  std::int64_t i = 0;
  for (; i + W <= n; i += W)
    for (int l = 0; l < W; ++l) {
      E e = exp_win(static_cast<E>(a[i + l] + d[i + l]) - shift);
      s[l] += e;
      dd[i + l] += e * f;
    }
  double r = 0;
  for (; i < n; ++i) {
    E e = exp_win(static_cast<E>(a[i] + d[i]) - shift);
    r += static_cast<double>(e);
    dd[i] += e * f;
  }
  for (int l = 0; l < W; ++l) r += static_cast<double>(s[l]);
  return r;
}
}  // namespace

AD_SEMICRF_CLONES float win_max(const float* a, const float* d, std::int64_t n) { return max_body(a, d, n); }
AD_SEMICRF_CLONES double win_max(const double* a, const double* d, std::int64_t n) { return max_body(a, d, n); }
AD_SEMICRF_CLONES double win_sum(const float* a, const float* d, std::int64_t n, float shift) {
  return sum_body(a, d, n, shift);
}
AD_SEMICRF_CLONES double win_sum(const double* a, const double* d, std::int64_t n, double shift) {
  return sum_body(a, d, n, shift);
}
AD_SEMICRF_CLONES double win_sum_grad(const float* a, const float* d, std::int64_t n, float shift, float f,
                                      float* dd) {
  return sum_grad_body(a, d, n, shift, f, dd);
}
AD_SEMICRF_CLONES double win_sum_grad(const double* a, const double* d, std::int64_t n, double shift, double f,
                                      double* dd) {
  return sum_grad_body(a, d, n, shift, f, dd);
}

}  // namespace ad::semicrf::detail
