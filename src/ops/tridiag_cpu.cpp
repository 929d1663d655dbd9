// CPU kernels: tridiagonal solve (Thomas) and its gradient, the resolvent
// diagonal through ratio recurrences and its gradient.
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "core/graph_impl.hpp"
#include "ops/parallel.hpp"
#include "ops/semiseparable_cpu.hpp"

namespace ad::semisep {

namespace {
using i64 = std::int64_t;
constexpr i64 kColBlock = 256;  // columns per task of a tridiagonal solve
constexpr i64 kRowBlock = 1024; // rows per task of a band-gradient reduction
}  // namespace

// ---- tridiag_solve ----
void fail_pivot(const char* op, double pivot, i64 row, i64 N) {
  kernel_fail(op, fmt::format("zero or non-finite pivot {} at row {} of the tridiagonal system (N = {}): the "
                              "matrix is singular or needs pivoting",
                              pivot, row, N));
}

std::size_t tridiag_ws_bytes(i64 N, std::size_t elem) {
  Carve c;
  c.take<char>(N * static_cast<i64>(elem));
  c.take<char>(N * static_cast<i64>(elem));
  return c.bytes;
}

template <class T>
void tridiag_solve(const char* op, i64 N, i64 outer, i64 inner, const T* d, const T* up, const T* lo, const T* b, T* y,
                   bool trans, void* ws) {
  if (trans) std::swap(up, lo);
  Carve cv{static_cast<char*>(ws)};
  T* cp = reinterpret_cast<T*>(cv.take<char>(N * static_cast<i64>(sizeof(T))));   // c'_i = up_i / den_i
  T* den = reinterpret_cast<T*>(cv.take<char>(N * static_cast<i64>(sizeof(T))));  // pivots
  // forward elimination coefficients: independent of b, formed once
  T c_prev = T(0);
  for (i64 i = 0; i < N; ++i) {
    T p = thomas_pivot(d[i], i ? lo[i - 1] : T(0), c_prev);
    if (!(p != T(0)) || !std::isfinite(p)) fail_pivot(op, static_cast<double>(p), i, N);
    den[i] = p;
    c_prev = i + 1 < N ? up[i] / p : T(0);
    cp[i] = c_prev;
  }
  i64 blocks = (inner + kColBlock - 1) / kColBlock;
  parallel::parallel_for(outer * blocks, 8.0 * static_cast<double>(outer * N * inner), [&](i64 t) {
    i64 o = t / blocks, c0 = (t % blocks) * kColBlock, c1 = std::min(inner, c0 + kColBlock);
    const T* bo = b + o * N * inner;
    T* yo = y + o * N * inner;
    for (i64 c = c0; c < c1; ++c) yo[c] = bo[c] / den[0];
    for (i64 i = 1; i < N; ++i) {
      const T* bi = bo + i * inner;
      const T* yp = yo + (i - 1) * inner;
      T* yi = yo + i * inner;
      T l = lo[i - 1], p = den[i];
      for (i64 c = c0; c < c1; ++c) yi[c] = (bi[c] - l * yp[c]) / p;
    }
    for (i64 i = N - 2; i >= 0; --i) {
      T* yi = yo + i * inner;
      const T* yn = yo + (i + 1) * inner;
      T q = cp[i];
      for (i64 c = c0; c < c1; ++c) yi[c] -= q * yn[c];
    }
  });
}

template <class T>
void tridiag_solve_backward(const char* op, i64 N, i64 outer, i64 inner, const T* d, const T* up, const T* lo,
                            const T* y, const T* g, T* lam, T* dd, T* dup, T* dlo, void* ws) {
  tridiag_solve(op, N, outer, inner, d, up, lo, g, lam, true, ws);
  i64 blocks = (N + kRowBlock - 1) / kRowBlock;
  parallel::parallel_for(blocks, 6.0 * static_cast<double>(outer * N * inner), [&](i64 t) {
    i64 i0 = t * kRowBlock, i1 = std::min(N, i0 + kRowBlock);
    for (i64 i = i0; i < i1; ++i) tridiag_band_grads_row(i, N, outer, inner, lam, y, dd, dup, dlo);
  });
}

// ---- tridiag_resolvent_diag ----
std::size_t resolvent_ws_bytes(i64 N, i64 K) {
  Carve c;
  c.take<double>(2 * N * K);
  return c.bytes;
}

namespace {
// r_i = theta_i / theta_{i-1}, s_i = phi_i / phi_{i+1} of A = T - zI, in double.
}  // namespace

template <class T>
void resolvent_diag(i64 N, i64 K, const T* d, const T* up, const T* lo, const T* z, T* out, void* ws) {
  auto* w = static_cast<double*>(ws);
  parallel::parallel_for(K, 12.0 * static_cast<double>(N * K), [&](i64 k) {
    double *r = w + 2 * k * N, *s = r + N;
    double zk = static_cast<double>(z[k]);
    resolvent_ratios(N, d, up, lo, zk, r, s);
    for (i64 i = 0; i < N; ++i) out[k * N + i] = static_cast<T>(resolvent_diag(r[i], s[i], static_cast<double>(d[i]) - zk));
  });
}

std::size_t resolvent_backward_ws_bytes(i64 N, i64 K) {
  Carve c;
  c.take<double>(5 * N * K);  // per shift: r, s, ab, gu, gl (resolvent_backward_sweep)
  return c.bytes;
}

// Reverse mode through the two ratio recurrences, one shift per task
// (resolvent_backward_sweep, shared with the CUDA kernel), then the shifts'
// contributions summed in order.
template <class T>
void resolvent_diag_backward(i64 N, i64 K, const T* d, const T* up, const T* lo, const T* z, const T* dg, T* dd,
                             T* dup, T* dlo, T* dz, void* ws) {
  auto* w = static_cast<double*>(ws);
  parallel::parallel_for(K, 30.0 * static_cast<double>(N * K), [&](i64 k) {
    double *r = w + 5 * k * N, *s = r + N, *ab = s + N, *gu = ab + N, *gl = gu + N;
    double zk = static_cast<double>(z[k]);
    resolvent_ratios(N, d, up, lo, zk, r, s);
    dz[k] = static_cast<T>(resolvent_backward_sweep(N, d, up, lo, zk, dg + k * N, r, s, ab, gu, gl));
  });
  // sum over shifts in order
  i64 blocks = (N + kRowBlock - 1) / kRowBlock;
  parallel::parallel_for(blocks, static_cast<double>(4 * N * K), [&](i64 t) {
    i64 i0 = t * kRowBlock, i1 = std::min(N, i0 + kRowBlock);
    for (i64 i = i0; i < i1; ++i) resolvent_band_sums_row(i, N, K, w, dd, dup, dlo);
  });
}

// ---- tridiag_resolvent_diag_complex ----  (the per-shift math: semiseparable_math.hpp, shared with CUDA)
std::size_t resolvent_complex_ws_bytes(i64 N, i64 K) {
  Carve c;
  c.take<Cplx>(2 * N * K);
  return c.bytes;
}

template <class T>
void resolvent_diag_complex(i64 N, i64 K, const T* d, const T* up, const T* lo, const T* z, T* out, void* ws) {
  auto* w = static_cast<Cplx*>(ws);
  parallel::parallel_for(K, 40.0 * static_cast<double>(N * K), [&](i64 k) {
    Cplx *r = w + 2 * k * N, *s = r + N;
    const Cplx zk{static_cast<double>(z[2 * k]), static_cast<double>(z[2 * k + 1])};
    resolvent_ratios_complex(N, d, up, lo, zk, r, s);
    T* o = out + 2 * k * N;
    for (i64 i = 0; i < N; ++i) {
      const Cplx G = semisep::resolvent_diag_complex(r[i], s[i], resolvent_shifted(d, i, zk));
      o[2 * i] = static_cast<T>(G.re);
      o[2 * i + 1] = static_cast<T>(G.im);
    }
  });
}

std::size_t resolvent_complex_backward_ws_bytes(i64 N, i64 K) {
  Carve c;
  c.take<Cplx>(3 * N * K);
  c.take<double>(2 * N * K);
  return c.bytes;
}

template <class T>
void resolvent_diag_complex_backward(i64 N, i64 K, const T* d, const T* up, const T* lo, const T* z, const T* dg,
                                     T* dd, T* dup, T* dlo, T* dz, void* ws) {
  Carve cv{static_cast<char*>(ws)};
  Cplx* cw = cv.take<Cplx>(3 * N * K);    // per shift: r, s, abar
  double* ew = cv.take<double>(2 * N * K);  // per shift: gu, gl
  parallel::parallel_for(K, 120.0 * static_cast<double>(N * K), [&](i64 k) {
    Cplx *r = cw + 3 * k * N, *s = r + N, *ab = s + N;
    const Cplx zk{static_cast<double>(z[2 * k]), static_cast<double>(z[2 * k + 1])};
    resolvent_ratios_complex(N, d, up, lo, zk, r, s);
    const Cplx sz = resolvent_backward_sweep_complex(N, d, up, lo, zk, dg + 2 * k * N, r, s, ab, ew + 2 * k * N,
                                                         ew + 2 * k * N + N);
    dz[2 * k] = static_cast<T>(-sz.re);
    dz[2 * k + 1] = static_cast<T>(sz.im);
  });
  // sum over shifts in order
  i64 blocks = (N + kRowBlock - 1) / kRowBlock;
  parallel::parallel_for(blocks, static_cast<double>(4 * N * K), [&](i64 t) {
    i64 i0 = t * kRowBlock, i1 = std::min(N, i0 + kRowBlock);
    for (i64 i = i0; i < i1; ++i) resolvent_complex_band_sums_row(i, N, K, cw, ew, dd, dup, dlo);
  });
}

#define AD_TRIDIAG_INST(T)                                                                                      \
  template void tridiag_solve<T>(const char*, i64, i64, i64, const T*, const T*, const T*, const T*, T*, bool, \
                                 void*);                                                                        \
  template void tridiag_solve_backward<T>(const char*, i64, i64, i64, const T*, const T*, const T*, const T*,   \
                                          const T*, T*, T*, T*, T*, void*);                                     \
  template void resolvent_diag<T>(i64, i64, const T*, const T*, const T*, const T*, T*, void*);               \
  template void resolvent_diag_backward<T>(i64, i64, const T*, const T*, const T*, const T*, const T*, T*, T*, \
                                           T*, T*, void*);                                                 \
  template void resolvent_diag_complex<T>(i64, i64, const T*, const T*, const T*, const T*, T*, void*);       \
  template void resolvent_diag_complex_backward<T>(i64, i64, const T*, const T*, const T*, const T*, const T*, \
                                                   T*, T*, T*, T*, void*);
AD_TRIDIAG_INST(float)
AD_TRIDIAG_INST(double)
#undef AD_TRIDIAG_INST

}  // namespace ad::semisep
