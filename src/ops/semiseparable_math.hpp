#pragma once
// Per-element math of the semiseparable and tridiagonal ops, shared by the
// CPU kernels and (later) the CUDA kernels (AD_HD).
//
// Conventions: T is N x N tridiagonal with diagonal d[0..N), superdiagonal
// up[i] = T[i][i+1] and subdiagonal lo[i] = T[i+1][i] (i in [0, N-1)).
// H = T + U V^T with U, V of shape (N, r), row-major.
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

// Ratio form of the theta/phi recurrences of A = T - z I (a_i = d_i - z,
// e_i = up_i lo_i): r_i = theta_i / theta_{i-1} = a_i - e_{i-1} / r_{i-1},
// s_i = phi_i / phi_{i+1} = a_i - e_i / s_{i+1}. The ratios stay O(|a| + |e|/|r|)
// where theta and phi themselves grow or shrink geometrically with N.
AD_HD double resolvent_ratio(double a, double e, double prev) { return a - e / prev; }
// diag((T - zI)^-1)_i = theta_{i-1} phi_{i+1} / theta_N = 1 / (r_i + s_i - a_i).
AD_HD double resolvent_diag(double r, double s, double a) { return 1.0 / (r + s - a); }
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

}  // namespace ad::semisep
