#pragma once
// Per-element math of the semiseparable and tridiagonal ops, shared by the
// CPU kernels and the CUDA kernels (AD_HD).
//
// Conventions: T is N x N tridiagonal with diagonal d[0..N), superdiagonal
// up[i] = T[i][i+1] and subdiagonal lo[i] = T[i+1][i] (i in [0, N-1)).
// H = T + U V^T with U, V of shape (N, r), row-major.
#include <cmath>
#include <cstdint>

#include "ad/dtype.hpp"
#include "ad/hd.hpp"

namespace ad::semisep {

// Storage types of U and V in mixed precision (bits of a bf16 / f16 value).
struct Bf16 { std::uint16_t bits; };
struct F16 { std::uint16_t bits; };
AD_HD float to_compute(float v) { return v; }
AD_HD double to_compute(double v) { return v; }
AD_HD float to_compute(Bf16 v) { return bf16_to_f32(v.bits); }
AD_HD float to_compute(F16 v) { return f16_to_f32(v.bits); }

// (T x)_i = lo[i-1] x[i-1] + d[i] x[i] + up[i] x[i+1]; absent neighbours
// are passed as 0 coefficients.
template <class T> AD_HD T tridiag_row(T lo_prev, T diag, T up, T x_prev, T x, T x_next) {
  return lo_prev * x_prev + diag * x + up * x_next;
}

// Thomas forward elimination, one row: den_i = d_i - lo_{i-1} c_{i-1},
// c_i = up_i / den_i (c_{-1} = 0). Returns den_i (0 = zero pivot).
template <class T> AD_HD T thomas_pivot(T diag, T lo_prev, T c_prev) { return diag - lo_prev * c_prev; }

// Band gradients of a tridiagonal solve for row i, from lam = T^-T g and the
// solution y, both (outer, N, inner): dd_i = -sum lam_i y_i,
// dup_i = -sum lam_i y_{i+1}, dlo_i = -sum lam_{i+1} y_i, summed in double
// over outer then inner, in order.
template <class T>
AD_HD void tridiag_band_grads_row(std::int64_t i, std::int64_t N, std::int64_t outer, std::int64_t inner, const T* lam,
                                  const T* y, T* dd, T* dup, T* dlo) {
  double sd = 0, su = 0, sl = 0;
  for (std::int64_t o = 0; o < outer; ++o) {
    const T* li = lam + (o * N + i) * inner;
    const T* yi = y + (o * N + i) * inner;
    for (std::int64_t c = 0; c < inner; ++c) sd += static_cast<double>(li[c]) * yi[c];
    if (i + 1 < N) {
      for (std::int64_t c = 0; c < inner; ++c) su += static_cast<double>(li[c]) * yi[inner + c];
      for (std::int64_t c = 0; c < inner; ++c) sl += static_cast<double>(li[inner + c]) * yi[c];
    }
  }
  dd[i] = static_cast<T>(-sd);
  if (i + 1 < N) {
    dup[i] = static_cast<T>(-su);
    dlo[i] = static_cast<T>(-sl);
  }
}

// Ratio form of the theta/phi recurrences of A = T - z I (a_i = d_i - z,
// e_i = up_i lo_i): r_i = theta_i / theta_{i-1} = a_i - e_{i-1} / r_{i-1},
// s_i = phi_i / phi_{i+1} = a_i - e_i / s_{i+1}. The ratios stay O(|a| + |e|/|r|)
// where theta and phi themselves grow or shrink geometrically with N. e / prev
// is formed as (up / prev) lo, never up lo: with every entry and z scaled by
// 2^k the ratios scale by 2^k exactly, where up lo over- or underflowed for
// entries past about 1e154 or below 1e-154 (NaN, or the coupling lost).
// A coupling that is exactly 0 (up or lo) leaves r_i = a_i whatever r_{i-1}
// is: T splits into blocks, and a zero minor of one block (0 / 0) must not
// reach the next.
AD_HD double resolvent_ratio(double a, double up, double lo, double prev) {
  return (up == 0 || lo == 0) ? a : a - (up / prev) * lo;
}
// diag((T - zI)^-1)_i = theta_{i-1} phi_{i+1} / theta_N = 1 / (r_i + s_i - a_i).
AD_HD double resolvent_diag(double r, double s, double a) { return 1.0 / (r + s - a); }
// Both ratio sweeps of one shift z over rows [0, N): r[i] and s[i].
template <class T>
AD_HD void resolvent_ratios(std::int64_t N, const T* d, const T* up, const T* lo, double z, double* r, double* s) {
  r[0] = static_cast<double>(d[0]) - z;
  for (std::int64_t i = 1; i < N; ++i)
    r[i] = resolvent_ratio(static_cast<double>(d[i]) - z, static_cast<double>(up[i - 1]), static_cast<double>(lo[i - 1]),
                           r[i - 1]);
  s[N - 1] = static_cast<double>(d[N - 1]) - z;
  for (std::int64_t i = N - 2; i >= 0; --i)
    s[i] = resolvent_ratio(static_cast<double>(d[i]) - z, static_cast<double>(up[i]), static_cast<double>(lo[i]), s[i + 1]);
}
// The backward sweeps run on T / 2^m, z / 2^m (resolvent_scale_exponent):
// every ratio is then O(1) where T's entries are of one size, whatever that
// size is, and the gradients are scaled back at the end (G(T, z) =
// G(T / c, z / c) / c, so dG/dT = (dG/dT')(T / c) / c^2): exact in powers of
// two, so a gradient that is a finite double comes out finite, where r_i^2,
// up_i lo_i or G_i^2 at T's own scale over- or underflowed.
AD_HD bool resolvent_finite(double v) { return v - v == 0; }
AD_HD int resolvent_scale_exponent(std::int64_t N, const double* r, const double* s) {
  double big = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    const double a = r[i] < 0 ? -r[i] : r[i], b = s[i] < 0 ? -s[i] : s[i];
    if (resolvent_finite(a) && a > big) big = a;
    if (resolvent_finite(b) && b > big) big = b;
  }
  int m = 0;
  if (big > 0) std::frexp(big, &m);
  return m;
}
// e_j / w^2 times x, as (x (up_j / w)) (lo_j / w): never up lo or w^2; an exactly
// zero coupling gives 0 (a split T, whatever w is).
AD_HD double resolvent_coupling_sq(double x, double up, double lo, double w) {
  return (up == 0 || lo == 0) ? 0.0 : (x * (up / w)) * (lo / w);
}
// The last step of both backward sweeps: gu holds dL'/de_i' on T / 2^m; it
// becomes dL/dup_i = e lo_i and gl dL/dlo_i = e up_i, at T's scale.
template <class T>
AD_HD void resolvent_split_coupling(std::int64_t N, const T* up, const T* lo, int m, double* gu, double* gl) {
  for (std::int64_t i = 0; i < N; ++i) {
    if (i + 1 < N) {
      const double e = gu[i];
      gu[i] = std::ldexp(e * std::ldexp(static_cast<double>(lo[i]), -m), -2 * m);
      gl[i] = std::ldexp(e * std::ldexp(static_cast<double>(up[i]), -m), -2 * m);
    } else {
      gu[i] = gl[i] = 0;
    }
  }
}
// Reverse mode of one shift, given its ratios r, s and the cotangent dg of
// G_i = 1 / D_i, D_i = r_i + s_i - a_i: Dbar_i = -dg_i G_i^2;
// rbar_i = Dbar_i + rbar_{i+1} e_i / r_i^2, sbar_i = Dbar_i + sbar_{i-1} e_{i-1} / s_i^2;
// ab_i = rbar_i + sbar_i - Dbar_i (= dL/da_i); eb_{i-1} -= rbar_i / r_{i-1},
// eb_i -= sbar_i / s_{i+1} (= dL/de_i). On return ab holds dL/da_i, gu dL/dup_i
// (= eb_i lo_i) and gl dL/dlo_i (= eb_i up_i), at T's scale; r and s are
// scaled by 2^-m (see above). Returns dL/dz = -sum ab.
template <class T>
AD_HD double resolvent_backward_sweep(std::int64_t N, const T* d, const T* up, const T* lo, double z, const T* dg,
                                      double* r, double* s, double* ab, double* gu, double* gl) {
  const int m = resolvent_scale_exponent(N, r, s);
  for (std::int64_t i = 0; i < N; ++i) {
    r[i] = std::ldexp(r[i], -m);
    s[i] = std::ldexp(s[i], -m);
  }
  auto U = [&](std::int64_t i) { return std::ldexp(static_cast<double>(up[i]), -m); };
  auto L = [&](std::int64_t i) { return std::ldexp(static_cast<double>(lo[i]), -m); };
  auto dbar = [&](std::int64_t i) {
    double G = resolvent_diag(r[i], s[i], std::ldexp(static_cast<double>(d[i]) - z, -m));
    return -static_cast<double>(dg[i]) * G * G;
  };
  double* eb = gu;  // dL'/de' accumulates in gu, split into gu and gl at the end
  for (std::int64_t i = 0; i < N; ++i) {
    ab[i] = -dbar(i);
    eb[i] = 0;
  }
  double rb = 0;
  for (std::int64_t i = N - 1; i >= 0; --i) {
    rb = dbar(i) + (i + 1 < N ? resolvent_coupling_sq(rb, U(i), L(i), r[i]) : 0.0);
    ab[i] += rb;
    if (i >= 1) eb[i - 1] -= rb / r[i - 1];
  }
  double sb = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    sb = dbar(i) + (i >= 1 ? resolvent_coupling_sq(sb, U(i - 1), L(i - 1), s[i]) : 0.0);
    ab[i] += sb;
    if (i + 1 < N) eb[i] -= sb / s[i + 1];
  }
  double sz = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    ab[i] = std::ldexp(ab[i], -2 * m);
    sz += ab[i];
  }
  resolvent_split_coupling(N, up, lo, m, gu, gl);
  return -sz;
}
// Row i of the resolvent backward's band gradients: the per-shift partials
// in w (shift k: ab at w[5kN + 2N + i], gu at + 3N, gl at + 4N) summed over
// the K shifts in order, in double.
template <class T>
AD_HD void resolvent_band_sums_row(std::int64_t i, std::int64_t N, std::int64_t K, const double* w, T* dd, T* dup,
                                   T* dlo) {
  double sa = 0, su = 0, sl = 0;
  for (std::int64_t k = 0; k < K; ++k) {
    sa += w[5 * k * N + 2 * N + i];
    su += w[5 * k * N + 3 * N + i];
    sl += w[5 * k * N + 4 * N + i];
  }
  dd[i] = static_cast<T>(sa);
  if (i + 1 < N) {
    dup[i] = static_cast<T>(su);
    dlo[i] = static_cast<T>(sl);
  }
}
// Complex shifts: the same ratios in complex arithmetic with e real. e / w
// for w = c + i d by Smith's method (no c^2 + d^2, so no overflow or
// underflow for any finite w). With d = 0 the real part is exactly e / c,
// the real op's quotient; w = 0 gives (e / c, 0), the real op's +-inf, after
// which the next ratio a - e / inf = a is exact again.
AD_HD void resolvent_div_complex(double e, double c, double d, double& re, double& im) {
  if (c == 0 && d == 0) {
    re = e / c;
    im = 0;
  } else if ((c < 0 ? -c : c) >= (d < 0 ? -d : d)) {
    double t = d / c, den = c + d * t;
    re = e / den;
    im = -e * t / den;
  } else {
    double t = c / d, den = c * t + d;
    re = e * t / den;
    im = -e / den;
  }
}

// A complex number in double, for the complex resolvent's recurrences: the
// CPU and the GPU run this code (no std::complex on the device). Products
// and sums are the textbook formulas; division is Smith's method.
struct Cplx {
  double re, im;
};
AD_HD Cplx operator+(Cplx a, Cplx b) { return {a.re + b.re, a.im + b.im}; }
AD_HD Cplx operator-(Cplx a, Cplx b) { return {a.re - b.re, a.im - b.im}; }
AD_HD Cplx operator-(Cplx a) { return {-a.re, -a.im}; }
AD_HD Cplx operator*(Cplx a, Cplx b) { return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
AD_HD Cplx operator*(Cplx a, double e) { return {a.re * e, a.im * e}; }
// e / w, e real (resolvent_div_complex)
AD_HD Cplx div_real(double e, Cplx w) {
  Cplx q;
  resolvent_div_complex(e, w.re, w.im, q.re, q.im);
  return q;
}
// a / w by Smith's method (w = 0: the real quotient's infinities, as the real op)
AD_HD Cplx operator/(Cplx a, Cplx w) {
  const double c = w.re, d = w.im;
  if (c == 0 && d == 0) return {a.re / c, a.im / c};
  if ((c < 0 ? -c : c) >= (d < 0 ? -d : d)) {
    const double t = d / c, den = c + d * t;
    return {(a.re + a.im * t) / den, (a.im - a.re * t) / den};
  }
  const double t = c / d, den = c * t + d;
  return {(a.re * t + a.im) / den, (a.im * t - a.re) / den};
}
// a_i = d_i - z, complex; with Im z = 0 every real part below is the real op's value, bit for bit.
template <class T> AD_HD Cplx resolvent_shifted(const T* d, std::int64_t i, Cplx z) {
  return {static_cast<double>(d[i]) - z.re, -z.im};
}
// Both ratio sweeps of one complex shift z: r_i = a_i - e_{i-1} / r_{i-1},
// s_i = a_i - e_i / s_{i+1} (e_i = up_i lo_i real, formed as the real op does:
// (up / w) lo, never up lo).
template <class T>
AD_HD void resolvent_ratios_complex(std::int64_t N, const T* d, const T* up, const T* lo, Cplx z, Cplx* r, Cplx* s) {
  auto e_over = [&](std::int64_t i, Cplx w) {  // an exactly zero coupling: 0 (resolvent_ratio)
    const double u = static_cast<double>(up[i]), l = static_cast<double>(lo[i]);
    return (u == 0 || l == 0) ? Cplx{0, 0} : div_real(u, w) * l;
  };
  r[0] = resolvent_shifted(d, 0, z);
  for (std::int64_t i = 1; i < N; ++i) r[i] = resolvent_shifted(d, i, z) - e_over(i - 1, r[i - 1]);
  s[N - 1] = resolvent_shifted(d, N - 1, z);
  for (std::int64_t i = N - 2; i >= 0; --i) s[i] = resolvent_shifted(d, i, z) - e_over(i, s[i + 1]);
}
// G_ii = 1 / (r_i + s_i - a_i)
AD_HD Cplx resolvent_diag_complex(Cplx r, Cplx s, Cplx a) { return div_real(1.0, r + s - a); }
// The real op's reverse sweeps (resolvent_backward_sweep) in complex
// arithmetic, on T / 2^m and z / 2^m as there (m from the larger of the real
// and imaginary parts). Every map from (a, e) to G is holomorphic, so with the
// cotangent Gbar = dL/dRe G - i dL/dIm G (dg holds (re, im) pairs) the chain
// rule needs no conjugates. For a real input x entering through w,
// dL/dx = Re(wbar dw/dx): ab (complex) holds abar; gu and gl (real) dL/dup_i
// = Re ebar_i lo_i and dL/dlo_i = Re ebar_i up_i, at T's scale.
// Returns sum_i abar_i; a_i = d_i - x - i y gives dL/dx = -Re of it,
// dL/dy = Im of it.
template <class T>
AD_HD Cplx resolvent_backward_sweep_complex(std::int64_t N, const T* d, const T* up, const T* lo, Cplx z, const T* dg,
                                            Cplx* r, Cplx* s, Cplx* ab, double* gu, double* gl) {
  int m = 0;
  {
    double big = 0;
    for (std::int64_t i = 0; i < N; ++i) {
      const double parts[4] = {r[i].re, r[i].im, s[i].re, s[i].im};
      for (double v : parts) {
        const double a = v < 0 ? -v : v;
        if (resolvent_finite(a) && a > big) big = a;
      }
    }
    if (big > 0) std::frexp(big, &m);
  }
  auto scaled = [&](Cplx w) { return Cplx{std::ldexp(w.re, -m), std::ldexp(w.im, -m)}; };
  for (std::int64_t i = 0; i < N; ++i) {
    r[i] = scaled(r[i]);
    s[i] = scaled(s[i]);
  }
  auto U = [&](std::int64_t i) { return std::ldexp(static_cast<double>(up[i]), -m); };
  auto L = [&](std::int64_t i) { return std::ldexp(static_cast<double>(lo[i]), -m); };
  // x e_j / w^2 as ((x up_j / w) lo_j / w); 0 for an exactly zero coupling
  auto coupling_sq = [&](Cplx x, std::int64_t j, Cplx w) {
    const double u = U(j), l = L(j);
    return (u == 0 || l == 0) ? Cplx{0, 0} : ((x * u) / w * l) / w;
  };
  auto dbar = [&](std::int64_t i) {
    const Cplx G = resolvent_diag_complex(r[i], s[i], scaled(resolvent_shifted(d, i, z)));
    const Cplx gbar{static_cast<double>(dg[2 * i]), -static_cast<double>(dg[2 * i + 1])};
    return -(gbar * G * G);
  };
  double* eb = gu;  // Re ebar' accumulates in gu, split into gu and gl at the end
  for (std::int64_t i = 0; i < N; ++i) {
    ab[i] = -dbar(i);
    eb[i] = 0;
  }
  Cplx rb{0, 0};
  for (std::int64_t i = N - 1; i >= 0; --i) {
    rb = dbar(i) + (i + 1 < N ? coupling_sq(rb, i, r[i]) : Cplx{0, 0});
    ab[i] = ab[i] + rb;
    if (i >= 1) eb[i - 1] -= (rb / r[i - 1]).re;
  }
  Cplx sb{0, 0};
  for (std::int64_t i = 0; i < N; ++i) {
    sb = dbar(i) + (i >= 1 ? coupling_sq(sb, i - 1, s[i]) : Cplx{0, 0});
    ab[i] = ab[i] + sb;
    if (i + 1 < N) eb[i] -= (sb / s[i + 1]).re;
  }
  Cplx sz{0, 0};
  for (std::int64_t i = 0; i < N; ++i) {
    ab[i] = Cplx{std::ldexp(ab[i].re, -2 * m), std::ldexp(ab[i].im, -2 * m)};
    sz = sz + ab[i];
  }
  resolvent_split_coupling(N, up, lo, m, gu, gl);
  return sz;
}
// Row i of the complex resolvent backward's band gradients: per shift k,
// abar at cw[3kN + 2N + i], gu at ew[2kN + i] and gl at ew[2kN + N + i],
// summed over the K shifts in order, in double (dd_i = sum Re abar).
template <class T>
AD_HD void resolvent_complex_band_sums_row(std::int64_t i, std::int64_t N, std::int64_t K, const Cplx* cw,
                                           const double* ew, T* dd, T* dup, T* dlo) {
  double sa = 0, su = 0, sl = 0;
  for (std::int64_t k = 0; k < K; ++k) {
    sa += cw[3 * k * N + 2 * N + i].re;
    su += ew[2 * k * N + i];
    sl += ew[2 * k * N + N + i];
  }
  dd[i] = static_cast<T>(sa);
  if (i + 1 < N) {
    dup[i] = static_cast<T>(su);
    dlo[i] = static_cast<T>(sl);
  }
}

// ---- the Woodbury capacitance system (semiseparable_solve) ----
// LU with partial pivoting of the r x r matrix a (row-major, double), in
// place: the first largest |a[i][k]| of rows i >= k is the pivot, piv[k] its
// row. False on a zero or non-finite pivot (a singular matrix); a is then
// partly eliminated. Run by one CPU thread, and by one GPU thread.
AD_HD bool lu_finite(double v) {
#if defined(__CUDA_ARCH__)
  return isfinite(v);
#else
  return std::isfinite(v);
#endif
}
AD_HD bool lu_factor(double* a, std::int64_t r, std::int64_t* piv) {
  for (std::int64_t k = 0; k < r; ++k) {
    std::int64_t p = k;
    for (std::int64_t i = k + 1; i < r; ++i) {
      const double c = a[i * r + k], m = a[p * r + k];
      if ((c < 0 ? -c : c) > (m < 0 ? -m : m)) p = i;
    }
    piv[k] = p;
    if (!(a[p * r + k] != 0.0) || !lu_finite(a[p * r + k])) return false;
    if (p != k)
      for (std::int64_t j = 0; j < r; ++j) {
        const double t = a[k * r + j];
        a[k * r + j] = a[p * r + j];
        a[p * r + j] = t;
      }
    for (std::int64_t i = k + 1; i < r; ++i) {
      const double f = a[i * r + k] / a[k * r + k];
      a[i * r + k] = f;
      for (std::int64_t j = k + 1; j < r; ++j) a[i * r + j] -= f * a[k * r + j];
    }
  }
  return true;
}
// Solves (LU) s = w for one right-hand side w (length r, stride st) in place,
// in double through tmp (r doubles); scale multiplies the result as it is
// stored (1, or -1 where the caller wants -s).
template <class T>
AD_HD void lu_solve(const double* a, std::int64_t r, const std::int64_t* piv, T* w, std::int64_t st, double* tmp,
                    double scale = 1.0) {
  for (std::int64_t k = 0; k < r; ++k) tmp[k] = static_cast<double>(w[k * st]);
  for (std::int64_t k = 0; k < r; ++k) {
    const double t = tmp[k];
    tmp[k] = tmp[piv[k]];
    tmp[piv[k]] = t;
  }
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < i; ++j) tmp[i] -= a[i * r + j] * tmp[j];
  for (std::int64_t i = r - 1; i >= 0; --i) {
    for (std::int64_t j = i + 1; j < r; ++j) tmp[i] -= a[i * r + j] * tmp[j];
    tmp[i] /= a[i * r + i];
  }
  for (std::int64_t k = 0; k < r; ++k) w[k * st] = static_cast<T>(scale * tmp[k]);
}

// C = I + S (S = V^T T^-1 U, r x r, formed in the input dtype T) in double,
// factored in place by lu_factor. False when C is singular to working
// precision: ||C^-1||_1 (1 + ||S||_1) u >= 0.1, u the unit roundoff of T.
// C's entries carry errors of about u (1 + ||S||) from forming S, so past
// that bound the solve has no correct digit (H = t (I - 1 1^T / N) gave
// C ~ 1e-16 instead of 0 and y ~ 1e15 without an error). ||C^-1||_1 is
// exact (r solves, O(r^3), like the LU). col and tmp hold r doubles each.
template <class T>
AD_HD bool capacitance_factor(const T* S, std::int64_t r, double* C, std::int64_t* piv, double* col, double* tmp) {
  double snorm = 0;
  for (std::int64_t l = 0; l < r; ++l) {
    double c = 0;
    for (std::int64_t k = 0; k < r; ++k) {
      const double x = static_cast<double>(S[k * r + l]);
      c += x < 0 ? -x : x;
    }
    snorm = c > snorm ? c : snorm;
  }
  for (std::int64_t k = 0; k < r; ++k)
    for (std::int64_t l = 0; l < r; ++l) C[k * r + l] = (k == l ? 1.0 : 0.0) + static_cast<double>(S[k * r + l]);
  if (!lu_factor(C, r, piv)) return false;
  double inorm = 0;
  for (std::int64_t j = 0; j < r; ++j) {
    for (std::int64_t k = 0; k < r; ++k) col[k] = k == j ? 1.0 : 0.0;
    lu_solve(C, r, piv, col, 1, tmp);
    double c = 0;
    for (std::int64_t k = 0; k < r; ++k) c += col[k] < 0 ? -col[k] : col[k];
    inorm = c > inorm ? c : inorm;
  }
  const double u = sizeof(T) <= 4 ? 0x1p-24 : 0x1p-53;
  return lu_finite(inorm) && inorm * (1.0 + snorm) * u < 0.1;
}

}  // namespace ad::semisep
