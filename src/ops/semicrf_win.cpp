// The semi-Markov CRF's hot loops: windowed max and exp-sums over two
// contiguous arrays (a ring column and a column of D). Each runs in W =
// 64 / sizeof(T) independent lanes (one AVX-512 register, two AVX2 ones) and
// combines the lanes in a fixed order, so the result does not depend on the
// instruction set. With GCC on x86-64 the functions are compiled for
// x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the baseline, picked at load
// time (target_clones); the default build has no -march flag.
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/vec.hpp"
#include "ops/semicrf_cpu.hpp"
#include "ops/semicrf_math.hpp"

#define AD_SEMICRF_CLONES AD_TARGET_CLONES("arch=x86-64-v4", "arch=x86-64-v3", "default")

namespace ad::semicrf::detail {

namespace {
template <class E> constexpr int kW = static_cast<int>(64 / sizeof(E));
// GCC/Clang vector extensions: the compare-select below vectorises on every
// target (a scalar ?: reduction would not be if-converted under -ftrapping-math).
template <class E> struct Vec { typedef E type __attribute__((vector_size(64))); };

// x = a + d over W elements
template <class E, class V> [[gnu::always_inline]] inline void load_sum(V& x, const E* a, const E* d) {
  V va, vd;
  std::memcpy(&va, a, sizeof(V));
  std::memcpy(&vd, d, sizeof(V));
  x = va + vd;
}

template <class E>
[[gnu::always_inline]] inline E max_body(const E* __restrict a, const E* __restrict d, std::int64_t n) {
  constexpr int W = kW<E>;
  using V = typename Vec<E>::type;
  const E ninf = -std::numeric_limits<E>::infinity();
  V m0, m1, v, w;
  for (int l = 0; l < W; ++l) m0[l] = m1[l] = ninf;
  std::int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {  // two accumulators: the max has latency
    load_sum(v, a + i, d + i);
    load_sum(w, a + i + W, d + i + W);
    m0 = v > m0 ? v : m0;
    m1 = w > m1 ? w : m1;
  }
  m0 = m1 > m0 ? m1 : m0;
  E r = ninf;
  for (int l = 0; l < W; ++l) r = m0[l] > r ? m0[l] : r;
  for (; i < n; ++i) {
    E x = a[i] + d[i];
    r = x > r ? x : r;
  }
  return r;
}

// Σ exp_win(a + d − shift), per lane in E, lanes combined in f64 in a fixed order.
template <class E, bool Grad>
[[gnu::always_inline]] inline double sum_body(const E* __restrict a, const E* __restrict d, std::int64_t n, E shift,
                                              E f, E* __restrict dd) {
  constexpr int W = kW<E>;
  using V = typename Vec<E>::type;
  using M = decltype(V{} > V{});
  const E lo = sizeof(E) == 4 ? E(-88) : E(-708);
  E s[W];
  for (int l = 0; l < W; ++l) s[l] = E(0);
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    // a group of 4W terms all below exp_win's zero threshold adds exactly 0: skip it
    V x0, x1, x2, x3;
    load_sum(x0, a + i, d + i);
    load_sum(x1, a + i + W, d + i + W);
    load_sum(x2, a + i + 2 * W, d + i + 2 * W);
    load_sum(x3, a + i + 3 * W, d + i + 3 * W);
    x0 = x1 > x0 ? x1 : x0;
    x2 = x3 > x2 ? x3 : x2;
    x0 = x2 > x0 ? x2 : x0;
    M live = (x0 - shift) >= lo;
    std::uint64_t bits[sizeof(M) / 8], any = 0;
    std::memcpy(bits, &live, sizeof(M));
    for (std::size_t u = 0; u < sizeof(M) / 8; ++u) any |= bits[u];
    if (!any) continue;
    for (int u = 0; u < 4 * W; u += W)
      for (int l = 0; l < W; ++l) {
        E e = exp_win(static_cast<E>(a[i + u + l] + d[i + u + l]) - shift);
        s[l] += e;
        if constexpr (Grad) dd[i + u + l] += e * f;
      }
  }
  for (; i + W <= n; i += W)
    for (int l = 0; l < W; ++l) {
      E e = exp_win(static_cast<E>(a[i + l] + d[i + l]) - shift);
      s[l] += e;
      if constexpr (Grad) dd[i + l] += e * f;
    }
  double r = 0;
  for (; i < n; ++i) {
    E e = exp_win(static_cast<E>(a[i] + d[i]) - shift);
    r += static_cast<double>(e);
    if constexpr (Grad) dd[i] += e * f;
  }
  for (int l = 0; l < W; ++l) r += static_cast<double>(s[l]);
  return r;
}
}  // namespace

AD_SEMICRF_CLONES float win_max(const float* a, const float* d, std::int64_t n) { return max_body(a, d, n); }
AD_SEMICRF_CLONES double win_max(const double* a, const double* d, std::int64_t n) { return max_body(a, d, n); }
AD_SEMICRF_CLONES double win_sum(const float* a, const float* d, std::int64_t n, float shift) {
  return sum_body<float, false>(a, d, n, shift, 0.0f, nullptr);
}
AD_SEMICRF_CLONES double win_sum(const double* a, const double* d, std::int64_t n, double shift) {
  return sum_body<double, false>(a, d, n, shift, 0.0, nullptr);
}
AD_SEMICRF_CLONES double win_sum_grad(const float* a, const float* d, std::int64_t n, float shift, float f,
                                      float* dd) {
  return sum_body<float, true>(a, d, n, shift, f, dd);
}
AD_SEMICRF_CLONES double win_sum_grad(const double* a, const double* d, std::int64_t n, double shift, double f,
                                      double* dd) {
  return sum_body<double, true>(a, d, n, shift, f, dd);
}

}  // namespace ad::semicrf::detail
