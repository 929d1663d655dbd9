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

#include "ad/dtype.hpp"
#include "core/vec.hpp"
#include "ops/semicrf_cpu.hpp"
#include "ops/semicrf_math.hpp"

#define AD_SEMICRF_CLONES AD_TARGET_CLONES("arch=x86-64-v4", "arch=x86-64-v3", "default")

namespace ad::semicrf::detail {

namespace {
template <class E> constexpr int kW = static_cast<int>(64 / sizeof(E));
// W lanes (64 bytes) as 64 / VB GCC/Clang vectors of VB bytes: one with
// AVX-512, two 32-byte ones without (a 64-byte vector would live on the
// stack there; see ad::wide_vectors). The same lanes either way, so the
// same results. The compare-select below vectorises on every target (a
// scalar ?: reduction would not be if-converted under -ftrapping-math).
template <class E, int VB> struct Lanes {
  typedef E V __attribute__((vector_size(VB)));
  static constexpr int P = 64 / VB, H = kW<E> / P;  // vectors, lanes per vector
  V v[P];
  static Lanes all(E x) {
    Lanes r;
    for (int p = 0; p < P; ++p)
      for (int l = 0; l < H; ++l) r.v[p][l] = x;
    return r;
  }
  // a + d over the W elements from a, d
  static Lanes sum(const E* a, const E* d) {
    Lanes r;
    for (int p = 0; p < P; ++p) {
      V va, vd;
      std::memcpy(&va, a + p * H, sizeof(V));
      std::memcpy(&vd, d + p * H, sizeof(V));
      r.v[p] = va + vd;
    }
    return r;
  }
  // lane by lane: x where x > m, else m
  static Lanes max(const Lanes& x, const Lanes& m) {
    Lanes r;
    for (int p = 0; p < P; ++p) r.v[p] = x.v[p] > m.v[p] ? x.v[p] : m.v[p];
    return r;
  }
  E lane(int l) const { return v[l / H][l % H]; }
  // some lane has x - shift >= lo
  bool any_at_least(E shift, E lo) const {
    std::uint64_t any = 0;
    for (int p = 0; p < P; ++p) {
      auto live = (v[p] - shift) >= lo;
      std::uint64_t bits[sizeof(live) / 8];
      std::memcpy(bits, &live, sizeof(live));
      for (std::size_t u = 0; u < sizeof(live) / 8; ++u) any |= bits[u];
    }
    return any != 0;
  }
};

template <class E, int VB>
[[gnu::always_inline]] inline E max_lanes(const E* __restrict a, const E* __restrict d, std::int64_t n) {
  constexpr int W = kW<E>;
  using L = Lanes<E, VB>;
  const E ninf = -std::numeric_limits<E>::infinity();
  L m0 = L::all(ninf), m1 = L::all(ninf);
  std::int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {  // two accumulators: the max has latency
    m0 = L::max(L::sum(a + i, d + i), m0);
    m1 = L::max(L::sum(a + i + W, d + i + W), m1);
  }
  m0 = L::max(m1, m0);
  E r = ninf;
  for (int l = 0; l < W; ++l) r = m0.lane(l) > r ? m0.lane(l) : r;
  for (; i < n; ++i) {
    E x = a[i] + d[i];
    r = x > r ? x : r;
  }
  return r;
}
template <class E>
[[gnu::always_inline]] inline E max_body(const E* __restrict a, const E* __restrict d, std::int64_t n) {
  return wide_vectors() ? max_lanes<E, 64>(a, d, n) : max_lanes<E, 32>(a, d, n);
}

// Σ exp_win((a − shift) + d [+ lo]), per lane in E, lanes combined in f64 in a
// fixed order. a − shift first: the ring value and the shift are the large
// numbers (up to the lap's growth, hundreds of nats) and nearly cancel for the
// terms that count, so their difference is exact (Sterbenz) and d and lo, the
// small ones, are added to it (a + d first rounded at a's size). lo: the ring
// value's low part as bf16 bits (f32 rings hold hi + lo: docs/design.md
// "Precision").
template <class E, bool Grad, bool Lo, int VB>
[[gnu::always_inline]] inline double sum_lanes(const E* __restrict a, const std::uint16_t* __restrict lo_part,
                                               const E* __restrict d, std::int64_t n, E shift, E f, E* __restrict dd) {
  constexpr int W = kW<E>;
  using L = Lanes<E, VB>;
  const E lo = sizeof(E) == 4 ? E(-88) : E(-708);
  auto x = [&](std::int64_t j) {
    E v = static_cast<E>(a[j] - shift) + d[j];
    if constexpr (Lo) v += static_cast<E>(bf16_to_f32(lo_part[j]));
    return v;
  };
  E s[W];
  for (int l = 0; l < W; ++l) s[l] = E(0);
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    // a group of 4W terms all below exp_win's zero threshold adds exactly 0: skip it
    // (the high parts decide: a low part is below an ulp of its high part)
    const L x01 = L::max(L::sum(a + i + W, d + i + W), L::sum(a + i, d + i));
    const L x23 = L::max(L::sum(a + i + 3 * W, d + i + 3 * W), L::sum(a + i + 2 * W, d + i + 2 * W));
    if (!L::max(x23, x01).any_at_least(shift, lo - E(1))) continue;
    for (int u = 0; u < 4 * W; u += W)
      for (int l = 0; l < W; ++l) {
        E e = exp_win(x(i + u + l));
        s[l] += e;
        if constexpr (Grad) dd[i + u + l] += e * f;
      }
  }
  for (; i + W <= n; i += W)
    for (int l = 0; l < W; ++l) {
      E e = exp_win(x(i + l));
      s[l] += e;
      if constexpr (Grad) dd[i + l] += e * f;
    }
  double r = 0;
  for (; i < n; ++i) {
    E e = exp_win(x(i));
    r += static_cast<double>(e);
    if constexpr (Grad) dd[i] += e * f;
  }
  for (int l = 0; l < W; ++l) r += static_cast<double>(s[l]);
  return r;
}
template <class E, bool Grad>
[[gnu::always_inline]] inline double sum_body(const E* __restrict a, const std::uint16_t* __restrict lo,
                                              const E* __restrict d,
                                              std::int64_t n, E shift, E f, E* __restrict dd) {
  if (lo)
    return wide_vectors() ? sum_lanes<E, Grad, true, 64>(a, lo, d, n, shift, f, dd)
                          : sum_lanes<E, Grad, true, 32>(a, lo, d, n, shift, f, dd);
  return wide_vectors() ? sum_lanes<E, Grad, false, 64>(a, lo, d, n, shift, f, dd)
                        : sum_lanes<E, Grad, false, 32>(a, lo, d, n, shift, f, dd);
}
}  // namespace

AD_SEMICRF_CLONES float win_max(const float* a, const float* d, std::int64_t n) { return max_body(a, d, n); }
AD_SEMICRF_CLONES double win_max(const double* a, const double* d, std::int64_t n) { return max_body(a, d, n); }
AD_SEMICRF_CLONES double win_sum(const float* a, const std::uint16_t* lo, const float* d, std::int64_t n,
                                  float shift) {
  return sum_body<float, false>(a, lo, d, n, shift, 0.0f, nullptr);
}
AD_SEMICRF_CLONES double win_sum(const double* a, const std::uint16_t* lo, const double* d, std::int64_t n,
                                  double shift) {
  return sum_body<double, false>(a, lo, d, n, shift, 0.0, nullptr);
}
AD_SEMICRF_CLONES double win_sum_grad(const float* a, const std::uint16_t* lo, const float* d, std::int64_t n,
                                      float shift, float f, float* dd) {
  return sum_body<float, true>(a, lo, d, n, shift, f, dd);
}
AD_SEMICRF_CLONES double win_sum_grad(const double* a, const std::uint16_t* lo, const double* d, std::int64_t n,
                                      double shift, double f, double* dd) {
  return sum_body<double, true>(a, lo, d, n, shift, f, dd);
}

}  // namespace ad::semicrf::detail
